"""The conformance check's stated goal: one implementation in one dtype with the ``ci``
profile takes at most 10 s (issue 18), for a softmax that passes and for one that fails
(a failure costs Hypothesis' shrinking on top).
"""

import statistics

from conftest import NOTES, check_goal, interleave, record_samples

from stability.model.softmax import get_softmax
from stability.testing import check_segment_softmax, conformance_examples

SECTION = "Conformance check, one implementation in one dtype (ci profile)"
GOAL_SECONDS = 10.0


def check(name: str) -> None:
    check_segment_softmax(get_softmax(name), dtypes=("float32",), profile="ci")


def test_one_ci_check_within_ten_seconds():
    check("stable")  # TensorFlow's first-call set-up is not the check's cost
    seconds = interleave(
        {"stable, float32": (check, ("stable",)), "naive, float32": (check, ("naive",))}, 2
    )
    NOTES[SECTION] = (
        f"`check_segment_softmax(fn, dtypes=('float32',), profile='ci')`: "
        f"{conformance_examples('ci')} examples for each of the six properties, then the "
        "bisection for the finite logits; `naive` fails every property, so its time includes "
        "shrinking."
    )
    for way, samples in seconds.items():
        record_samples(SECTION, way, samples, per=1, unit="s per check")
        check_goal(SECTION, f"median s ({way})", statistics.median(samples), "<=", GOAL_SECONDS)
