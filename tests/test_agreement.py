"""Comparing two rows of one run: exactly in one environment, by what holds on any machine
across two; the rounding spread those comparisons allow, measured from rows."""

import math

import pandas as pd
import pytest

from stability.core.environment import describe, differences, parse, same_environment
from stability.core.errors import StabilityError
from stability.report.agreement import ACROSS, EXACT, compare_rows, epoch_allowance
from stability.report.spread import carried_layouts, measure, spread_markdown, stack_layouts

HERE = describe("1x1")
OTHER_THREADS = describe("2x1")


def failed(epoch: int, env: str = HERE, **changes) -> dict[str, str]:
    row = {
        "case": "seed",
        "variant": "raw_e",
        "seed": "0",
        "first_nan_epoch": str(epoch),
        "first_nan_step": str(epoch * 56),
        "first_nan_where": "forward",
        "failure_kind": "nonfinite",
        "failure_cause": "forward underflow (0/0)",
        "first_nan_op": "RealDiv (softmax_div)",
        "final_mae": "",
        "best_mae": "0.42",
        "wall_seconds": "10.0",
        "environment": env,
    }
    return {**row, **changes}


def test_the_environment_line_reads_back():
    facts = parse(HERE)
    assert facts["threads"] == "1x1"
    for name in ("tensorflow", "keras", "numpy", "hypothesis", "python", "cpu"):
        assert facts[name], name
    assert differences(HERE, OTHER_THREADS) == ["threads 1x1 vs 2x1"]
    assert differences(HERE, "") == ["environment not recorded"]
    assert same_environment(HERE, HERE) and not same_environment("", "")


def test_rows_of_one_environment_must_be_identical_but_for_timing():
    base = failed(71)
    assert compare_rows({**base, "wall_seconds": "99"}, base, 0.5).ok
    moved = compare_rows(failed(71, best_mae="0.4200001"), base, 0.5)
    assert moved.kind == EXACT and not moved.ok
    assert "best_mae" in moved.problems[0]


def test_across_environments_the_epoch_may_move_within_the_measured_spread():
    base = failed(100)
    within = compare_rows(failed(103, OTHER_THREADS, best_mae="0.5"), base, 0.03)
    assert within.kind == ACROSS and within.ok, within.describe()
    beyond = compare_rows(failed(104, OTHER_THREADS), base, 0.03)
    assert not beyond.ok and "epoch 100 -> 104" in beyond.problems[0]


@pytest.mark.parametrize(
    ("change", "word"),
    [
        ({"first_nan_op": "Exp (softmax_exp)"}, "first_nan_op"),
        ({"failure_cause": "forward overflow"}, "failure_cause"),
        ({"first_nan_where": "gradient"}, "first_nan_where"),
    ],
)
def test_across_environments_how_a_run_failed_must_hold(change, word):
    agreement = compare_rows(failed(100, OTHER_THREADS, **change), failed(100), 0.5)
    assert not agreement.ok and word in agreement.problems[0]


def test_across_environments_a_verdict_flip_is_a_change():
    finite = failed(100, OTHER_THREADS, first_nan_epoch="", final_mae="0.3")
    assert compare_rows(finite, failed(100), 0.5).problems == ("now stays finite",)
    finite_here = {**finite, "environment": HERE}
    assert compare_rows(failed(100, OTHER_THREADS), finite_here, 0.5).problems == ("now fails",)


def test_the_mae_is_compared_across_environments_only_with_a_tolerance():
    base = failed(100, first_nan_epoch="", final_mae="1.0")
    worse = failed(100, OTHER_THREADS, first_nan_epoch="", final_mae="3.0")
    assert compare_rows(worse, base, 0.1).ok
    assert not compare_rows(worse, base, 0.1, mae_tolerance=1.5).ok
    assert compare_rows(worse, base, 0.1, mae_tolerance=2.5).ok


def test_an_epoch_may_always_move_by_one():
    assert epoch_allowance(71, 0.0) == 1
    assert epoch_allowance(100, 0.05) == 5
    assert epoch_allowance(30, 0.05) == 1


def spread_rows(epochs: dict[str, list[float]], maes: dict[str, list[float]]) -> pd.DataFrame:
    rows = []
    for threads in epochs:
        for seed, (epoch, mae) in enumerate(zip(epochs[threads], maes[threads], strict=True)):
            rows.append(
                {
                    **failed(0, describe(threads)),
                    "seed": seed,
                    "dataset": "d",
                    "batch_size": 32,
                    "learning_rate": 0.01,
                    "threads": threads,
                    "first_nan_epoch": epoch,
                    "final_mae": mae,
                }
            )
    return pd.DataFrame(rows)


def test_the_spread_is_the_largest_move_against_the_reference_layout():
    nan = math.nan
    frame = spread_rows(
        {"1x1": [50, 100, nan], "2x1": [51, 100, nan], "8x1": [50, 104, nan]},
        {"1x1": [nan, nan, 1.0], "2x1": [nan, nan, 1.2], "8x1": [nan, nan, 0.9]},
    )
    spread = measure(frame)
    assert spread.reference == "1x1" and spread.layouts == ("1x1", "2x1", "8x1")
    moves = spread.overall
    assert (moves.runs, moves.failed, moves.moved) == (3, 2, 2)
    assert moves.epoch == pytest.approx(0.04) and moves.epoch_moves == 4
    assert moves.mae == pytest.approx(0.2)
    assert moves.verdict_flips == 0 and moves.how_changes == 0
    assert spread.epoch_tolerance("raw_e") == spread.epoch_tolerance() == moves.epoch
    text = spread_markdown("seed", frame, spread)
    assert "4 epoch(s), 4.00% of the reference epoch" in text
    assert "2 rerun(s) moved it" in text


def test_each_variant_has_its_own_tolerance_and_an_unmeasured_one_the_widest():
    nan = math.nan
    calm = spread_rows({"1x1": [100, 100], "2x1": [101, 100]}, {"1x1": [nan] * 2, "2x1": [nan] * 2})
    wild = calm.assign(variant="sigma_clip")
    wild.loc[wild["threads"] == "2x1", "first_nan_epoch"] = [150, 100]
    spread = measure(pd.concat([calm, wild], ignore_index=True))
    assert spread.epoch_tolerance("raw_e") == pytest.approx(0.01)
    assert spread.epoch_tolerance("sigma_clip") == pytest.approx(0.5)
    assert spread.epoch_tolerance("never_measured") == pytest.approx(0.5)


def test_a_verdict_that_flips_with_the_layout_is_counted():
    nan = math.nan
    frame = spread_rows({"1x1": [50, nan], "2x1": [nan, 70]}, {"1x1": [nan, 1], "2x1": [2, nan]})
    spread = measure(frame)
    assert spread.overall.verdict_flips == 2 and spread.overall.epoch == 0
    assert "2 rerun(s) failed where the reference stayed finite" in spread_markdown(
        "seed", frame, spread
    )


def on_cpu(frame: pd.DataFrame, cpu: str) -> pd.DataFrame:
    """``frame``'s rows as if trained on a CPU described by ``cpu``."""
    return frame.assign(
        environment=frame["environment"].str.replace(r", cpu .*$", f", cpu {cpu}", regex=True)
    )


def test_rows_of_another_cpu_join_the_spread_as_layouts_of_their_own():
    nan = math.nan
    here = spread_rows({"1x1": [50, 100], "2x1": [50, 100]}, {"1x1": [nan] * 2, "2x1": [nan] * 2})
    zen3 = on_cpu(
        spread_rows({"1x1": [60, 100], "8x1": [50, 101]}, {"1x1": [nan] * 2, "8x1": [nan] * 2}),
        "AMD EPYC; x86_64; family/model/stepping 25/1/1; flags avx",
    )
    reference = here[here["threads"] == "1x1"]
    theirs = carried_layouts(pd.concat([here, zen3]), parse(HERE)["cpu"], reference, "x.csv")
    assert list(theirs) == ["1x1", "2x1", "1x1 on AMD EPYC 25/1/1", "8x1 on AMD EPYC 25/1/1"]
    frame = stack_layouts(theirs)
    spread = measure(frame)
    assert spread.layouts == tuple(theirs)
    assert spread.overall.epoch == pytest.approx(0.2)
    text = spread_markdown("seed", frame, spread)
    assert "the other CPUs: AMD EPYC 25/1/1." in text


def test_carried_rows_must_be_runs_of_the_reference_and_say_where_they_ran():
    nan = math.nan
    rows = spread_rows({"1x1": [50]}, {"1x1": [nan]})
    other_data = rows.assign(dataset="e")
    with pytest.raises(StabilityError, match=r"^x.csv: none of its rows is a run of the"):
        carried_layouts(other_data, "cpu", rows, "x.csv")
    with pytest.raises(StabilityError, match="record its CPU and threads"):
        carried_layouts(rows.assign(environment=""), "cpu", rows, "x.csv")
    with pytest.raises(StabilityError, match="it lacks dataset"):
        carried_layouts(rows.drop(columns="dataset"), "cpu", rows, "x.csv")


def test_the_committed_spreads_rewrite_themselves_from_their_own_rows(tmp_path):
    """`tox -e report` passes each committed spread back with --other: what it does not
    retrain comes back as it was, byte for byte, in the same order."""
    from pathlib import Path

    from conftest import run_cli

    root = Path(__file__).parent.parent
    for case in ("seed", "batch_size", "learning_rate"):
        args = ["spread", str(root / "cases" / f"{case}.toml")]
        args += ["--reference", str(root / "reports" / f"{case}.csv"), "--layouts", "none"]
        args += ["--other", str(root / "reports" / f"{case}.spread.csv"), "--out", str(tmp_path)]
        if case == "seed":
            args += ["--variants", "raw_e,normalized_e,relu_e,grad_clip,sigma_clip,stable_softmax"]
        done = run_cli(*args, cwd=tmp_path)
        assert done.returncode == 0, done.stderr
        for suffix in (".spread.csv", ".spread.md"):
            written = (tmp_path / f"{case}{suffix}").read_text(encoding="utf-8")
            assert written == (root / "reports" / f"{case}{suffix}").read_text(encoding="utf-8")


def test_a_spread_s_own_cpu_is_its_reference_s_not_the_machine_s(tmp_path):
    """The committed learning_rate spread, its reference's CPU renamed to one no machine
    has: rewritten from its own rows it comes back byte for byte, its own layouts named by
    their threads alone, as on the machine that made them."""
    from pathlib import Path

    from conftest import run_cli

    root = Path(__file__).parent.parent
    reference = (root / "reports" / "learning_rate.csv").read_text(encoding="utf-8")
    home = parse(pd.read_csv(root / "reports" / "learning_rate.csv")["environment"][0])["cpu"]
    spread = (root / "reports" / "learning_rate.spread.csv").read_text(encoding="utf-8")
    made_up = "Made-up CPU; x86_64; family/model/stepping 0/0/0; flags avx"
    (tmp_path / "in").mkdir()
    for name, text in (("learning_rate.csv", reference), ("learning_rate.spread.csv", spread)):
        assert home in text
        (tmp_path / "in" / name).write_text(text.replace(home, made_up), encoding="utf-8")
    args = ["spread", str(root / "cases" / "learning_rate.toml"), "--layouts", "none"]
    args += ["--reference", str(tmp_path / "in" / "learning_rate.csv")]
    args += ["--other", str(tmp_path / "in" / "learning_rate.spread.csv"), "--out", str(tmp_path)]
    done = run_cli(*args, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    written = (tmp_path / "learning_rate.spread.csv").read_text(encoding="utf-8")
    assert written == (tmp_path / "in" / "learning_rate.spread.csv").read_text(encoding="utf-8")
    assert "on Made-up" not in (tmp_path / "learning_rate.spread.md").read_text(encoding="utf-8")


def test_a_layout_trained_on_a_cpu_other_than_the_reference_s_names_that_cpu(tmp_path):
    """The reference's rows recorded on a CPU no machine has: the 1x1 layout trained here is
    another CPU's rows, so it joins the spread as '1x1 on <this CPU>', beside the
    reference's own 1x1, not in its place."""
    from conftest import TINY_CASE, run_cli

    from stability.core.environment import cpu, short_cpu
    from stability.sweep.cases import parse_case
    from stability.sweep.runner import run_case

    case_file = tmp_path / "tiny.toml"
    case_file.write_text(TINY_CASE.replace('"raw_e", "stable_softmax"', '"stable_softmax"'))
    run_case(parse_case(case_file.read_text(), source="tiny"), tmp_path / "ref", progress=False)
    made_up = "Made-up CPU; x86_64; family/model/stepping 0/0/0; flags avx"
    reference = tmp_path / "ref" / "tiny.csv"
    text = reference.read_text(encoding="utf-8")
    assert cpu() in text
    reference.write_text(text.replace(cpu(), made_up), encoding="utf-8")
    args = ["spread", str(case_file), "--layouts", "1", "--reference", str(reference)]
    done = run_cli(*args, "--out", str(tmp_path / "out"), "--no-progress", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    threads = pd.read_csv(tmp_path / "out" / "tiny.spread.csv")["threads"]
    assert list(dict.fromkeys(threads)) == ["1x1", f"1x1 on {short_cpu(cpu())}"]
