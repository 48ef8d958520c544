"""Deprecated: a segment softmax's Hypothesis inputs moved to ``stability.testing.inputs``
(the strategy itself is public as ``stability.testing.softmax_inputs``).

This module warns on import and hands out every name of the new module, the same objects.
"""

import warnings

from stability.testing import inputs as _inputs

warnings.warn(
    "stability.model.softmax_inputs is deprecated; import from stability.testing (the "
    "strategy softmax_inputs) or stability.testing.inputs instead",
    DeprecationWarning,
    stacklevel=2,
)


def __getattr__(name: str) -> object:
    # Any name of the new module, looked up there, so the two never disagree.
    return getattr(_inputs, name)
