"""Deprecated: the conformance suite moved to ``stability.testing.conformance``.

This module warns on import and forwards every name of ``stability.testing`` to it; import
from ``stability.testing`` (or ``stability.testing.conformance``) instead.
"""

import warnings

import stability.testing as _testing
from stability.testing.finite_range import span_text
from stability.testing.inputs import DTYPES, reference_gradient, reference_softmax
from stability.testing.tolerance import tolerance_text

warnings.warn(
    "stability.model.conformance is deprecated; import from stability.testing "
    "(stability.testing.conformance) instead",
    DeprecationWarning,
    stacklevel=2,
)

#: Examples per property under each profile, as this module's ``PROFILES`` gave them
#: (now ``stability.testing.conformance_examples(profile)``).
PROFILES = {name: _testing.conformance_examples(name) for name in _testing.PROFILE_NAMES}


def __getattr__(name: str):
    """A name of ``stability.testing``, the same object; the old module's names live there."""
    if name in _testing.__all__:
        return getattr(_testing, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


#: The old module's names that ``stability.testing`` gives too, forwarded by ``__getattr__``.
_FORWARDED = [
    # stability.testing.conformance
    "ConformanceReport",
    "PropertyResult",
    "assert_segment_softmax_conforms",
    "check_segment_softmax",
    # stability.testing.implementation
    "ConformanceError",
    "Implementation",
    "as_implementation",
    "from_numpy",
    "from_tensorflow",
    # stability.testing.finite_range, .properties, .softmax_inputs, .tolerance
    "finite_logits",
    "PROPERTIES",
    "SoftmaxInput",
    "softmax_inputs",
    "DEFAULT_ULPS",
]
__all__ = [
    *_FORWARDED,
    "DTYPES",
    "PROFILES",
    "reference_gradient",
    "reference_softmax",
    "span_text",
    "tolerance_text",
]
