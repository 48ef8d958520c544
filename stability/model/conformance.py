"""Deprecated: the conformance suite moved to ``stability.testing.conformance``.

This module re-exports its names from ``stability.testing`` and warns on import; import
from ``stability.testing`` (or ``stability.testing.conformance``) instead.
"""

import warnings

from stability.testing.conformance import (
    ConformanceReport,
    PropertyResult,
    assert_segment_softmax_conforms,
    check_segment_softmax,
)
from stability.testing.finite_range import finite_logits, span_text
from stability.testing.implementation import (
    ConformanceError,
    Implementation,
    as_implementation,
    from_numpy,
    from_tensorflow,
)
from stability.testing.profiles import PROFILE_NAMES, conformance_examples
from stability.testing.properties import PROPERTIES
from stability.testing.softmax_inputs import (
    DTYPES,
    SoftmaxInput,
    reference_gradient,
    reference_softmax,
    softmax_inputs,
)
from stability.testing.tolerance import DEFAULT_ULPS, tolerance_text

warnings.warn(
    "stability.model.conformance is deprecated; import from stability.testing "
    "(stability.testing.conformance) instead",
    DeprecationWarning,
    stacklevel=2,
)

#: Examples per property under each profile, as this module's ``PROFILES`` gave them
#: (now ``stability.testing.conformance_examples(profile)``).
PROFILES = {name: conformance_examples(name) for name in PROFILE_NAMES}

__all__ = [
    "DEFAULT_ULPS",
    "DTYPES",
    "PROFILES",
    "PROPERTIES",
    "ConformanceError",
    "ConformanceReport",
    "Implementation",
    "PropertyResult",
    "SoftmaxInput",
    "as_implementation",
    "assert_segment_softmax_conforms",
    "check_segment_softmax",
    "finite_logits",
    "from_numpy",
    "from_tensorflow",
    "reference_gradient",
    "reference_softmax",
    "softmax_inputs",
    "span_text",
    "tolerance_text",
]
