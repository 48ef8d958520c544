"""The robustness map (``python -m stability map``): its bisection rule on planted failure
functions, its report's wording on planted rows, its bad input, and a smoke map trained
twice (files written, rows and boundaries the same on the rerun)."""

import math

import pandas as pd
import pytest

from stability import cli
from stability.core.failures import failed, failure_cause
from stability.core.results import RESULT_FIELDS, TIMING_FIELDS
from stability.data.generated import drawn_with
from stability.data.strategies import NAMED_DISTRIBUTIONS
from stability.explore.bisection import (
    FAILS_AT_LOW,
    FAILS_FROM,
    NEVER_FAILS,
    Bisection,
    bisect,
    midpoint,
)
from stability.explore.map import (
    MapRows,
    boundaries,
    grid_cells,
    parse_map,
    point_case,
    point_keys,
)
from stability.explore.map_report import map_markdown, read_map_rows
from stability.sweep.runner import run_configs

# --- the bisection rule, on planted fail(scale) functions (no training) -------------------


@pytest.mark.parametrize("threshold", [4.5, 17.0, 100.0, 999.0])
def test_bisection_brackets_a_planted_threshold(threshold):
    calls = []

    def fails(scale):
        calls.append(scale)
        return scale >= threshold

    found = bisect(fails, 4.0, 1000.0, steps=6)
    assert found.kind == FAILS_FROM
    assert found.lo < threshold <= found.hi
    assert found.words() == f"fails from {found.hi:g} [{found.lo:g}-{found.hi:g}]"
    assert len(calls) == len(set(calls)) == len(found.points) <= 2 + 6
    # each round halves the bracket in log space (up to the rounding of the midpoints)
    assert math.log(found.hi / found.lo) <= math.log(1000 / 4) / 2 ** (len(calls) - 2) * 1.05


def test_bisection_that_fails_at_the_low_end_stops_after_the_ends():
    found = bisect(lambda scale: True, 4.0, 1000.0, steps=6)
    assert (found.kind, found.points) == (FAILS_AT_LOW, (4.0, 1000.0))
    assert found.words() == "fails already at the smallest scale tried (4)"


def test_bisection_that_never_fails_stops_after_the_ends():
    found = bisect(lambda scale: False, 4.0, 1000.0, steps=6)
    assert (found.kind, found.points) == (NEVER_FAILS, (4.0, 1000.0))
    assert found.words() == "no failure up to the largest scale tried (1000)"


def test_bisection_with_no_rounds_reports_the_ends():
    found = bisect(lambda scale: scale > 50, 4.0, 1000.0, steps=0)
    assert (found.kind, found.lo, found.hi) == (FAILS_FROM, 4.0, 1000.0)


def test_bisection_stops_when_the_midpoint_rounds_onto_an_end():
    found = bisect(lambda scale: scale >= 1.005, 1.0, 1.01, steps=10)
    assert midpoint(found.lo, found.hi) in (found.lo, found.hi)
    assert len(found.points) < 12


def test_a_driven_bisection_asks_for_both_ends_first():
    search = Bisection(4.0, 1024.0, steps=2)
    assert search.pending() == [4.0, 1024.0]
    search.record(4.0, False)
    assert search.pending() == [1024.0]
    search.record(1024.0, True)
    assert search.pending() == [64.0]


# --- the failure cause of a row ------------------------------------------------------------


@pytest.mark.parametrize(
    ("row", "cause"),
    [
        ({"first_nan_epoch": "", "failure_kind": ""}, "none"),
        ({"first_nan_epoch": "3", "first_nan_where": "forward"}, "forward"),
        ({"first_nan_epoch": "2", "failure_kind": "normalization"}, "normalization"),
        ({"first_nan_epoch": "2", "failure_kind": "masked_gradient"}, "masked gradient"),
        ({"first_nan_epoch": math.nan, "first_nan_where": math.nan}, "none"),
        # issue 21's column, when a row has it, is read as it says
        ({"first_nan_epoch": "5", "failure_cause": "gradient explosion"}, "gradient explosion"),
        ({"first_nan_epoch": "", "failure_cause": "none"}, "none"),
    ],
)
def test_failure_cause_of_a_row(row, cause):
    assert failure_cause(row) == cause
    assert failed(row) == (cause != "none")


# --- the report, on planted rows -------------------------------------------------------------

PLANTED = """
name = "planted"
variants = ["raw_e", "stable_softmax", "weight_constrained"]
seeds = [0]
epochs = 7
num_datasets = 2

[map]
distributions = ["uniform", "clustered_high"]
scales = [4, 64, 1024]
bracket = [4, 1024]
steps = 3
"""

#: variant -> the scale from which its planted runs fail (None: never); weight_constrained's
#: failures are silent.
THRESHOLDS = {"raw_e": 100.0, "stable_softmax": None, "weight_constrained": 2.0}


def planted_rows(m, thresholds):
    """A row per run of every point any bisection or the grid could visit: the planted
    variant fails at scales >= its threshold."""
    scales = set(m.scales).union(*(_visited(m, t) for t in thresholds.values()))
    rows = []
    for v in m.case.variants:
        for d in m.distributions:
            for s in sorted(scales):
                for k, key in enumerate(point_keys(m, d, s)):
                    fails = thresholds[v] is not None and s >= thresholds[v]
                    silent = fails and v == "weight_constrained"
                    row = dict.fromkeys(RESULT_FIELDS, "")
                    row.update(
                        case=m.name,
                        variant=v,
                        seed="0",
                        dataset=key,
                        first_nan_epoch=str(k + 1) if fails else "",
                        first_nan_where="forward" if fails else "",
                        failure_kind="normalization" if silent else ("nonfinite" if fails else ""),
                        final_mae="" if fails and not silent else str(0.5 + k),
                    )
                    rows.append(row)
    return rows


def _visited(m, threshold):
    if threshold is None:
        return list(m.bracket)
    return bisect(lambda s: s >= threshold, *m.bracket, m.steps).points


def test_boundary_wording_follows_the_planted_rows():
    m = parse_map(PLANTED)
    rows = MapRows(m, planted_rows(m, THRESHOLDS))
    text = map_markdown(m, rows)
    found = boundaries(m, rows)
    raw = found[("raw_e", "uniform")]
    assert raw.kind == FAILS_FROM and raw.lo < THRESHOLDS["raw_e"] <= raw.hi
    assert f"| raw_e | {raw.words()} | {raw.words()} |" in text
    assert "fails from" in raw.words()
    never = "no failure up to the largest scale tried (1024)"
    assert f"| stable_softmax | {never} | {never} |" in text
    already = "fails already at the smallest scale tried (4)"
    assert f"| weight_constrained | {already} | {already} |" in text
    # silent failures are counted apart from NaN: weight_constrained's are all silent
    assert "| weight_constrained | uniform | 64 | 2 | 0 / 2 | 1 |" in text
    assert "| raw_e | uniform | 1024 | 2 | 2 / 0 | 1 | 1.5 | - | forward (2/2) |" in text
    assert "| stable_softmax | uniform | 4 | 2 | 0 / 0 | 0 | - | 1 | - |" in text


def test_run_counts_follow_the_rows():
    m = parse_map(PLANTED)
    rows = MapRows(m, planted_rows(m, THRESHOLDS))
    text = map_markdown(m, rows)
    found = boundaries(m, rows)
    points = sum(len(b.points) for b in found.values())
    assert f"The grid took {3 * 2 * 3 * 2} runs" in text
    assert f"The bisections evaluated {points} points, {points * 2} runs" in text


def test_a_different_threshold_moves_the_boundary():
    m = parse_map(PLANTED)
    low = boundaries(m, MapRows(m, planted_rows(m, {**THRESHOLDS, "raw_e": 10.0})))
    high = boundaries(m, MapRows(m, planted_rows(m, {**THRESHOLDS, "raw_e": 500.0})))
    assert low[("raw_e", "uniform")].hi < high[("raw_e", "uniform")].lo


def test_a_grid_cell_against_its_boundary_is_reported():
    m = parse_map(PLANTED)
    rows = planted_rows(m, THRESHOLDS)
    key = point_keys(m, "uniform", 64.0)[0]
    for row in rows:  # stable_softmax fails at 64 but passes at 1024: not one crossing
        if row["variant"] == "stable_softmax" and row["dataset"] == key:
            row.update(first_nan_epoch="3", failure_kind="nonfinite", first_nan_where="loss")
    text = map_markdown(m, MapRows(m, rows))
    assert "stable_softmax on uniform at 64 (fails)" in text


def test_missing_runs_are_an_error_not_a_boundary():
    m = parse_map(PLANTED)
    rows = planted_rows(m, THRESHOLDS)[1:]
    with pytest.raises(ValueError, match="of its 2 runs"):
        map_markdown(m, MapRows(m, rows))


def _redrawn(rows, version):
    """``rows`` as if another Hypothesis release had drawn their data sets."""
    installed = f"hypothesis='{drawn_with(rows[0]['dataset'])}'"
    return [
        {**row, "dataset": row["dataset"].replace(installed, f"hypothesis='{version}'")}
        for row in rows
    ]


def test_rows_drawn_by_another_hypothesis_release_are_found_under_their_keys():
    # A report rebuilt from committed rows after Hypothesis released a new version: the
    # rows' keys name the version that drew them, not the installed one.
    m = parse_map(PLANTED)
    rows = planted_rows(m, THRESHOLDS)
    other = _redrawn(rows, "0.0.1")
    assert all(drawn_with(row["dataset"]) == "0.0.1" for row in other)
    assert map_markdown(m, MapRows(m, other)) == map_markdown(m, MapRows(m, rows))


def test_rows_of_two_hypothesis_releases_are_not_mixed_into_one_cell():
    m = parse_map(PLANTED)
    rows = planted_rows(m, THRESHOLDS)
    half = len(rows) // 2
    mixed = _redrawn(rows[:half], "0.0.1") + _redrawn(rows[half:], "0.0.2")
    with pytest.raises(ValueError, match="of its 2 runs"):
        map_markdown(m, MapRows(m, mixed))


# --- bad input: one line, exit 2, nothing written ------------------------------------------

SMOKE = """
name = "smoke_map"
variants = ["raw_e"]
seeds = [0]
epochs = 2
# One data set a cell: the files, the boundary and the rerun need no second draw, and the
# default run trains half as much (the committed map, cases/map.toml, draws several).
num_datasets = 1

[model]
hidden = 8

[dataset]
num_graphs = 8
max_nodes = 6
max_edges = 12

[map]
distributions = ["uniform", "outliers"]
scales = [4, 1000]
bracket = [4, 1000]
steps = 1
"""


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (("scales = [4, 1000]", "scales = []"), "map.scales = [] is an empty grid"),
        (
            ('distributions = ["uniform", "outliers"]', "distributions = []"),
            "map.distributions = [] is an empty grid",
        ),
        (
            ("scales = [4, 1000]", "scales = [0.25, 1000]"),
            "map.scales: 0.25 is below the smallest distance",
        ),
        (
            ('distributions = ["uniform", "outliers"]', 'distributions = ["uniform", "gauss"]'),
            "map.distributions: 'gauss' is not a distribution; accepted: "
            + ", ".join(NAMED_DISTRIBUTIONS),
        ),
        (("bracket = [4, 1000]", "bracket = [1000, 4]"), "does not bracket"),
        (("bracket = [4, 1000]", "bracket = [4, 4]"), "does not bracket"),
        (("bracket = [4, 1000]", "bracket = [0.1, 1000]"), "map.bracket: 0.1 is below"),
        (
            # float32's largest number, whatever STABILITY_DTYPE the tox factor sets.
            (
                SMOKE,
                SMOKE.replace("epochs = 2", 'epochs = 2\ndtype = "float32"').replace(
                    "bracket = [4, 1000]", "bracket = [4, 1e39]"
                ),
            ),
            "above the dtype's largest number",
        ),
        (("steps = 1", "steps = -1"), "map.steps = -1 is not valid"),
        (("steps = 1", "fail_fraction = 0"), "map.fail_fraction = 0 is not valid"),
        (("[map]", "[mapp]"), "needs a [map] table"),
    ],
)
def test_bad_map_is_one_line_and_exit_2(tmp_path, capsys, change, message):
    case = tmp_path / "bad.toml"
    case.write_text(SMOKE.replace(*change), encoding="utf-8")
    out = tmp_path / "out"
    assert cli.main(["map", str(case), "--out", str(out), "--no-progress"]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("stability: error:"), lines
    assert message in lines[0]
    assert not out.exists()


def test_outlier_scale_below_max_distance_is_bad(tmp_path, capsys):
    case = tmp_path / "bad.toml"
    case.write_text(SMOKE.replace("scales = [4, 1000]", "scales = [2, 1000]"), encoding="utf-8")
    assert cli.main(["map", str(case), "--out", str(tmp_path / "out")]) == 2
    assert "dataset.max_distance = 4" in capsys.readouterr().err


def test_a_map_cases_epochs_is_every_cells_budget_uncapped():
    """Logits grow with training, so a map must be able to train long enough to see it:
    the case's ``epochs``, or ``--set epochs=N`` over it, reaches every cell as it is."""
    for overrides, budget in (([], 500), (["epochs=300"], 300)):
        m = parse_map(SMOKE.replace("epochs = 2", "epochs = 500"), overrides=overrides)
        budgets = {
            config.epochs
            for _, distribution, scale in grid_cells(m)
            for _, config in run_configs(point_case(m, distribution, scale, m.case.variants))
        }
        assert budgets == {budget}


# --- a smoke map, trained twice ----------------------------------------------------------------


ONLY_OUTLIERS = ["--set", 'map.distributions=["outliers"]']


def test_smoke_map_writes_its_files_and_reruns_to_the_same_rows(tmp_path, capsys):
    case = tmp_path / "smoke_map.toml"
    case.write_text(SMOKE, encoding="utf-8")
    outputs = []
    # The rerun retrains one distribution's column only (half the runs, to keep the default
    # run fast): its rows and its boundary must be the first run's.
    for out, only in ((tmp_path / "first", []), (tmp_path / "second", ONLY_OUTLIERS)):
        assert cli.main(["map", str(case), "--out", str(out), "--no-progress", *only]) == 0
        for suffix in (".csv", ".history.csv", ".md", ".failure_rate.png", ".mae.png"):
            assert (out / f"smoke_map{suffix}").stat().st_size > 0, suffix
        outputs.append(out)
    frames = [
        pd.read_csv(out / "smoke_map.csv").drop(columns=list(TIMING_FIELDS)) for out in outputs
    ]
    column = frames[0][frames[0]["dataset"].str.contains("distribution='outliers'")]
    assert len(column) == len(frames[1]) > 0
    pd.testing.assert_frame_equal(column.reset_index(drop=True), frames[1])
    texts = [(out / "smoke_map.md").read_text(encoding="utf-8") for out in outputs]
    m = parse_map(SMOKE)
    rows = read_map_rows(m, outputs[0] / "smoke_map.csv")
    found = boundaries(m, rows)
    only = parse_map(SMOKE.replace('["uniform", "outliers"]', '["outliers"]'))
    again = boundaries(only, read_map_rows(only, outputs[1] / "smoke_map.csv"))
    assert again[("raw_e", "outliers")] == found[("raw_e", "outliers")]
    assert again[("raw_e", "outliers")].words() in texts[1]
    for (variant, _), boundary in found.items():
        assert f"| {variant} | " in texts[0] and boundary.words() in texts[0]
    # every run of the grid and of the bisections, each once
    points = {(v, d, s) for (v, d), b in found.items() for s in b.points} | set(grid_cells(m))
    assert len(frames[0]) == len(points) * m.runs_per_cell
