"""``tox -e conformance``: check the harness's and public segment softmaxes, write
reports/conformance.md.

Marked ``conformance`` and deselected by default: it needs ``pip install
'stability[conformance]'`` and minutes. The public implementations' verdicts are findings,
not test outcomes; the tests assert only on the harness's own two softmaxes.
"""

import os
from pathlib import Path

import numpy as np
import pytest

from stability.core.files import atomic_write_text
from stability.core.limits import exp_limits
from stability.model.softmax import get_softmax
from stability.report.conformance import conformance_markdown
from stability.testing import check_segment_softmax

pytestmark = pytest.mark.conformance

REPORT = Path(os.environ.get("STABILITY_CONFORMANCE_REPORT", "reports/conformance.md"))
DTYPES = ("float16", "float32", "float64")


@pytest.fixture(scope="module")
def reports():
    from stability.testing.adapters import ADAPTERS

    found = {
        name: check_segment_softmax(get_softmax(name), name=f"stability {name}", dtypes=DTYPES)
        for name in ("naive", "stable")
    }
    unavailable = {}
    for name, adapter in ADAPTERS.items():
        try:
            implementation = adapter()
        except ImportError as exc:  # not installable here: said in the report, not hidden
            unavailable[name] = f"{type(exc).__name__}: {exc}"
            continue
        found[name] = check_segment_softmax(implementation, dtypes=DTYPES)
    REPORT.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(REPORT, conformance_markdown(list(found.values()), unavailable))
    return found


def test_stable_passes_every_property(reports):
    assert reports["stable"].passed, str(reports["stable"])


@pytest.mark.parametrize("dtype", DTYPES)
def test_naive_overflows_exactly_above_log_max(reports, dtype):
    """Finite up to the last representable logit at or below log(dtype max), not above."""
    naive = reports["naive"]
    assert not naive.passed
    _, high = naive.finite_logits[dtype]
    kind = np.dtype(dtype).type
    # log in float64: the exact line, not exp_limits' rounding of it to the dtype.
    overflow = float(np.log(np.float64(np.finfo(kind).max)))
    assert round(overflow, 2) == round(exp_limits(dtype).overflow, 2)
    assert high <= overflow < float(np.nextafter(kind(high), kind(np.inf))), (high, overflow)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_naive_underflows_exactly_below_log_tiny(reports, dtype):
    """A single edge [x] is 0 / 0 once exp(x) is flushed to 0: x below log(smallest normal)
    (TensorFlow flushes denormals in float32 and float64, not in float16), within 2 ULPs
    since exp itself rounds."""
    low, _ = reports["naive"].finite_logits[dtype]
    line = float(np.log(np.float64(np.finfo(dtype).tiny)))
    assert round(line, 2) == -round(exp_limits(dtype).underflow, 2)
    ulp = abs(float(np.spacing(np.dtype(dtype).type(line))))
    assert abs(low - line) <= 2 * ulp, (low, line)
