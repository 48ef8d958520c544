"""The calibrated seed case, trained for real (slow: about a minute per variant)."""

from dataclasses import replace
from pathlib import Path

import pytest

from stability.sweep.cases import load_case
from stability.sweep.runner import run_case

SEED_CASE = Path(__file__).parent.parent / "cases" / "seed.toml"


@pytest.mark.slow
def test_raw_e_hits_a_forward_nan_and_stable_softmax_does_not():
    case = replace(load_case(SEED_CASE), variants=("raw_e", "stable_softmax"), seeds=(0,))
    raw, stable = run_case(case, progress=False)
    assert raw.hit_nan, f"raw_e stayed finite for {case.epochs} epochs"
    assert raw.first_nan_where == "forward", raw.first_nan_where
    assert not stable.hit_nan, f"stable_softmax hit a NaN at epoch {stable.first_nan_epoch}"
