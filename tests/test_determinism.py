"""The same case and seed give the same rows and histories, timing columns aside."""

from conftest import TINY_CASE

from stability.core.results import TIMING_FIELDS
from stability.sweep.cases import parse_case
from stability.sweep.runner import run_case


def untimed(results):
    rows = [{k: v for k, v in r.row().items() if k not in TIMING_FIELDS} for r in results]
    return rows, [r.history_rows() for r in results]


def test_same_case_twice_gives_identical_rows():
    case = parse_case(TINY_CASE, source="tiny")
    first = untimed(run_case(case, progress=False))
    second = untimed(run_case(case, progress=False))
    assert first == second


def test_another_seed_gives_other_numbers():
    """Guards the test above against comparing constants."""
    a = parse_case(TINY_CASE, source="tiny")
    b = parse_case(TINY_CASE.replace("seeds = [0]", "seeds = [1]"), source="tiny")
    rows_a, _ = untimed(run_case(a, progress=False))
    rows_b, _ = untimed(run_case(b, progress=False))
    assert [r["best_mae"] for r in rows_a] != [r["best_mae"] for r in rows_b]
