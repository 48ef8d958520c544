"""The conformance API on the harness's own two softmaxes (ci profile), and its bad input.

The thresholds are derived from ``stability.core.limits``, never written down, and the
verdicts come from the checks themselves: each test fails if the checker stops telling a
stable softmax from a naive one.
"""

from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf

import stability
from stability.cli import main
from stability.core.errors import StabilityError
from stability.core.limits import exp_limits
from stability.model.softmax import get_softmax
from stability.testing import PROPERTIES, ConformanceError
from stability.testing.implementation import probe

STABLE, NAIVE = get_softmax("stable"), get_softmax("naive")


def log64(value) -> float:
    """log computed in float64: the exact line, not its rounding to a smaller dtype."""
    return float(np.log(np.float64(value)))


def test_stable_passes_every_property():
    report = stability.check_segment_softmax(STABLE, dtypes=("float32",), profile="ci")
    assert report.passed, str(report)
    assert {r.name for r in report.results} == set(PROPERTIES)
    largest = float(np.finfo(np.float32).max)
    assert report.finite_logits["float32"] == (-largest, largest)


def test_naive_fails_at_the_float32_exp_lines_with_a_counterexample():
    report = stability.check_segment_softmax(NAIVE, dtypes=("float32",), profile="ci")
    failed = {r.name for r in report.failures}
    assert {"finite", "gradient_finite"} <= failed, str(report)
    low, high = report.finite_logits["float32"]
    info = np.finfo(np.float32)
    overflow, underflow = log64(info.max), log64(info.tiny)
    # The last finite logit is the last float32 at or below log(max); one step up overflows.
    assert high <= overflow < float(np.nextafter(np.float32(high), np.float32(np.inf)))
    # exp(x) for one edge [x] is flushed to 0 below log(smallest normal); exp rounds, so
    # within 2 ULPs. stability.core.limits draws the same lines.
    assert abs(low - underflow) <= 2 * abs(float(np.spacing(np.float32(underflow))))
    assert round(high, 2) == round(exp_limits("float32").overflow, 2)
    assert round(low, 2) == -round(exp_limits("float32").underflow, 2)
    finite = next(r for r in report.failures if r.name == "finite")
    assert "float32 logits [" in finite.counterexample
    assert "expected softmax" in finite.counterexample and "actual" in finite.counterexample
    assert "\n" not in finite.counterexample


def masked_stable(logits, segment_ids, num_segments, mask):
    """The stable softmax over the unmasked edges; masked edges get 0."""
    lowest = tf.constant(np.finfo(logits.dtype.as_numpy_dtype).min, logits.dtype)
    kept = tf.where(mask, logits, lowest)
    # Masked entries never set the max, so a masked huge logit cannot shift the segment.
    top = tf.math.unsorted_segment_max(kept, segment_ids, num_segments)
    shift = tf.stop_gradient(tf.gather(top, segment_ids))
    exp = tf.where(mask, tf.exp(tf.where(mask, logits - shift, tf.zeros_like(logits))), 0)
    total = tf.math.unsorted_segment_sum(exp, segment_ids, num_segments)
    # A segment with every edge masked sums to 0: divide by 1 there, its outputs are all 0.
    total = tf.where(total > 0, total, tf.ones_like(total))
    return exp / tf.gather(total, segment_ids)


def masked_after_exp(logits, segment_ids, num_segments, mask):
    """The issue's bug: the mask applied after exp, so a masked overflow gives inf * 0."""
    exp = tf.exp(logits) * tf.cast(mask, logits.dtype)
    total = tf.math.unsorted_segment_sum(exp, segment_ids, num_segments)
    return exp / tf.gather(total, segment_ids)


def test_a_correctly_masked_softmax_passes():
    report = stability.check_segment_softmax(masked_stable, mask=True, dtypes=("float32",))
    assert report.passed, str(report)


def test_a_mask_applied_after_exp_fails():
    report = stability.check_segment_softmax(masked_after_exp, mask=True, dtypes=("float32",))
    finite = next(r for r in report.results if r.name == "finite")
    assert finite.status == "fail", str(report)
    assert "mask [" in finite.counterexample


def numpy_stable(logits, segment_ids, num_segments):
    """The stable segment softmax in NumPy."""
    top = np.full(num_segments, -np.inf, logits.dtype)
    np.maximum.at(top, segment_ids, logits)
    # Max subtracted: every exp argument <= 0 and each segment's largest term is 1. The
    # difference may overflow to -inf (-max - max), whose exp is the right 0.
    with np.errstate(over="ignore"):
        exp = np.exp(logits - top[segment_ids])
    total = np.zeros(num_segments, logits.dtype)
    np.add.at(total, segment_ids, exp)
    return exp / total[segment_ids]


def nan_softmax(logits, segment_ids, num_segments):
    """Wrong everywhere: NaN for every edge."""
    return np.full_like(logits, np.nan)


def test_a_numpy_softmax_has_no_gradient_properties():
    report = stability.check_segment_softmax(numpy_stable, dtypes=("float64",))
    verdicts = {r.name: r.status for r in report.results}
    assert verdicts["gradient_finite"] == verdicts["gradient_matches"] == "not applicable"
    assert report.passed, str(report)


def test_the_pytest_fixture_fails_with_the_counterexample(segment_softmax_conformance):
    segment_softmax_conformance(numpy_stable, dtypes=("float16",))
    with pytest.raises(AssertionError, match=r"fails finite: .*float16 logits"):
        segment_softmax_conformance(nan_softmax, dtypes=("float16",))


# --- bad input: one line each ---------------------------------------------------------------


def raises(logits, segment_ids, num_segments):
    raise RuntimeError("boom")


#: The edges of the probe input every softmax must handle first.
EDGES = len(probe("float32", mask=False).logits)


def wrong_shape(logits, segment_ids, num_segments):
    return tf.reshape(STABLE(logits, segment_ids, num_segments), [-1, 1])


def wrong_dtype(logits, segment_ids, num_segments):
    return tf.cast(STABLE(logits, segment_ids, num_segments), tf.float64)


@pytest.mark.parametrize(
    ("fn", "message"),
    [
        (raises, "raises raised RuntimeError: boom on a plain input"),
        (wrong_shape, f"returned output of shape [{EDGES}, 1] for logits of shape [{EDGES}]"),
        (wrong_dtype, "returned output of dtype float64 for float32 logits"),
        (42, "is not callable"),
    ],
)
def test_bad_softmax_is_one_line(fn, message):
    with pytest.raises(StabilityError) as error:
        stability.check_segment_softmax(fn, dtypes=("float32",))
    assert message in str(error.value)
    assert "\n" not in str(error.value)


@pytest.mark.parametrize(
    ("target", "message"),
    [
        ("no_such_module_here:fn", "target 'no_such_module_here' failed to import"),
        ("stability.model.softmax:no_such_fn", "has no 'no_such_fn'"),
        ("just_a_name", "must be MODULE:NAME"),
        ("tests.test_conformance:raises", "raised RuntimeError: boom"),
    ],
)
def test_cli_bad_target_exits_2_with_one_line(target, message, capsys):
    assert main(["conformance", target, "--dtype", "float32"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("stability: error: ") and message in err, err
    assert err.count("\n") == 1, err


def test_cli_exit_code_follows_the_verdict(capsys):
    assert main(["conformance", "tests.test_conformance:nan_softmax", "--dtype", "float16"]) == 1
    assert "fails finite" in capsys.readouterr().out
    assert main(["conformance", "tests.test_conformance:numpy_stable", "--dtype", "float32"]) == 0
    assert "conforms" in capsys.readouterr().out


def test_the_markdown_has_a_row_per_dtype_and_each_failure_once():
    from stability.report.conformance import conformance_markdown

    bad = stability.check_segment_softmax(nan_softmax, dtypes=("float16", "float64"))
    text = conformance_markdown([bad], {"missing": "ImportError: no module named 'missing'"})
    assert text.count("| nan_softmax | float16 |") == text.count("| nan_softmax | float64 |") == 1
    assert text.count("- **nan_softmax, float16, finite**: a non-finite output") == 1
    assert "- **missing**: ImportError" in text
    assert "0 of 1 implementations pass every property." in text


def test_a_softmax_that_changes_its_mind_fails_rather_than_crashing():
    calls = iter(range(10**6))

    def flaky(logits, segment_ids, num_segments):
        # Right on even calls, NaN on odd ones: no input fails twice in a row.
        out = numpy_stable(logits, segment_ids, num_segments)
        return out if next(calls) % 2 == 0 else np.full_like(out, np.nan)

    report = stability.check_segment_softmax(flaky, dtypes=("float64",))
    assert not report.passed


def per_segment(logits, segment_ids, num_segments):
    """One value per segment (its largest logit), not one per edge."""
    top = np.full(num_segments, -np.inf, np.asarray(logits).dtype)
    np.maximum.at(top, np.asarray(segment_ids), np.asarray(logits))
    return top


def test_a_softmax_returning_one_value_per_segment_is_refused_naming_its_shape():
    plain = probe("float32", mask=False)
    assert plain.num_segments != len(plain.logits)  # else the shapes could not tell
    with pytest.raises(ConformanceError) as error:
        stability.check_segment_softmax(per_segment, dtypes=("float32",))
    message = str(error.value)
    assert f"returned output of shape [{plain.num_segments}]" in message, message
    assert f"for logits of shape [{len(plain.logits)}]" in message, message
    assert "one value per segment" in message and "\n" not in message


# --- conformance targets: MODULE:NAME and FILE.py:NAME --------------------------------------

MY_SOFTMAX = """
from pathlib import Path

import numpy as np


def my_softmax(logits, segment_ids, num_segments):
    top = np.full(num_segments, -np.inf, logits.dtype)
    np.maximum.at(top, segment_ids, logits)
    with np.errstate(over="ignore"):  # -max - max is -inf, whose exp is the right 0
        exp = np.exp(logits - top[segment_ids])
    total = np.zeros(num_segments, logits.dtype)
    np.add.at(total, segment_ids, exp)
    return exp / total[segment_ids]
"""


@pytest.fixture
def softmax_file(tmp_path, monkeypatch, isolated_registries):
    """``lib/my_softmax.py`` beside the working folder ``work``."""
    (tmp_path / "lib").mkdir()
    (tmp_path / "work").mkdir()
    path = tmp_path / "lib" / "my_softmax.py"
    path.write_text(MY_SOFTMAX)
    monkeypatch.chdir(tmp_path / "work")
    return path


@pytest.mark.parametrize("form", ["relative", "absolute", "module"])
def test_a_target_names_a_file_or_a_module(softmax_file, monkeypatch, form):
    from stability.commands.conformance import _import_target

    if form == "module":
        monkeypatch.syspath_prepend(str(softmax_file.parent))
    spec = {
        "relative": "../lib/my_softmax.py",
        "absolute": str(softmax_file),
        "module": "my_softmax",
    }[form]
    fn = _import_target(f"{spec}:my_softmax")
    assert fn.__name__ == "my_softmax" and fn.__module__ == "my_softmax"
    assert Path(fn.__code__.co_filename).resolve() == softmax_file.resolve()


def test_the_cli_checks_a_softmax_in_a_file_up_the_tree(softmax_file, capsys):
    assert main(["conformance", "../lib/my_softmax.py:my_softmax", "--dtype", "float64"]) == 0
    assert "my_softmax" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("target", "message"),
    [
        ("../lib/absent.py:my_softmax", "target '../lib/absent.py': no such .py file"),
        ("../lib/my_softmax.py:my_sofmax", "has no 'my_sofmax'. Did you mean 'my_softmax'?"),
        ("../lib/my_softmax.py", "must be MODULE:NAME or FILE.py:NAME"),
    ],
    ids=["missing file", "missing function", "no function"],
)
def test_a_bad_file_target_is_one_line(softmax_file, capsys, target, message):
    assert main(["conformance", target, "--dtype", "float32"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("stability: error: ") and message in err, err
    assert err.count("\n") == 1, err
