"""What your own tests call: the segment softmax conformance suite, the Hypothesis
strategies and profiles, assertions whose messages show the values, and a small case
that trains in seconds.

As ``numpy.testing`` and ``hypothesis.extra`` do, this package is the testing surface,
apart from the harness's internals; what it re-exports below (``__all__``) is public.
The adapters for public softmaxes (TF-GNN, Spektral, jraph) are imported only when named:
``stability.testing.adapters`` (docs/conformance.md).
"""

from stability.data.strategies import datasets, edge_distances, graphs
from stability.testing.assertions import assert_finite, assert_normalized, assert_runs_finite
from stability.testing.conformance import (
    ConformanceReport,
    PropertyResult,
    assert_segment_softmax_conforms,
    check_segment_softmax,
)
from stability.testing.finite_range import finite_logits
from stability.testing.implementation import (
    ConformanceError,
    Implementation,
    as_implementation,
    from_numpy,
    from_tensorflow,
)
from stability.testing.inputs import SoftmaxInput, softmax_inputs
from stability.testing.profiles import (
    PROFILE_NAMES,
    conformance_examples,
    get_profile,
    register_profiles,
)
from stability.testing.properties import PROPERTIES
from stability.testing.small_case import SMALL_CASE
from stability.testing.tolerance import DEFAULT_ULPS

__all__ = [
    "DEFAULT_ULPS",
    "PROFILE_NAMES",
    "PROPERTIES",
    "SMALL_CASE",
    "ConformanceError",
    "ConformanceReport",
    "Implementation",
    "PropertyResult",
    "SoftmaxInput",
    "as_implementation",
    "assert_finite",
    "assert_normalized",
    "assert_runs_finite",
    "assert_segment_softmax_conforms",
    "check_segment_softmax",
    "conformance_examples",
    "datasets",
    "edge_distances",
    "finite_logits",
    "from_numpy",
    "from_tensorflow",
    "get_profile",
    "graphs",
    "register_profiles",
    "softmax_inputs",
]
