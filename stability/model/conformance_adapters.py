"""Deprecated: the adapters moved to ``stability.testing.adapters``.

This module re-exports them and warns on import; name them on the command line as
``stability.testing.adapters:<name>`` instead.
"""

import warnings

from stability.testing.adapters import (
    ADAPTERS,
    adapter,
    from_jax,
    jraph_segment_softmax,
    keras_dense_softmax,
    spektral_segment_softmax,
    tfgnn_softmax,
)

warnings.warn(
    "stability.model.conformance_adapters is deprecated; import from stability.testing.adapters "
    "instead",
    DeprecationWarning,
    stacklevel=2,
)

__all__ = [
    "ADAPTERS",
    "adapter",
    "from_jax",
    "jraph_segment_softmax",
    "keras_dense_softmax",
    "spektral_segment_softmax",
    "tfgnn_softmax",
]
