"""A run's summary from its history: best MAE over the kept epochs, and the divergence rule."""

from __future__ import annotations

import math

import pytest

from stability.core.results import EpochRecord
from stability.train.run_summary import (
    DIVERGENCE_FACTOR,
    DIVERGENCE_MIN_EPOCH,
    SUMMARY_FIELDS,
    RowSettings,
    divergence,
    kept_epochs,
    summarize,
)

FLOAT32 = RowSettings("float32")


def history(*maes: float) -> list[EpochRecord]:
    return [EpochRecord(epoch, val_mae=mae) for epoch, mae in enumerate(maes, start=1)]


def test_a_run_failing_in_its_first_epoch_has_no_best_mae():
    summary = summarize(history(2.9), first_nan_epoch=1, cfg=FLOAT32)
    assert summary["best_mae"] is None and summary["mae_before_nan"] is None


def test_best_mae_counts_only_the_epochs_before_the_failing_one():
    maes = (2.0, 1.5, 0.4, 0.1)  # the failing epoch 3 and the unguarded epoch 4 after it
    summary = summarize(history(*maes), first_nan_epoch=3, cfg=FLOAT32)
    assert kept_epochs(history(*maes), 3) == [1, 2]
    assert summary["best_mae"] == min(maes[:2])
    assert summary["mae_before_nan"] == maes[1]
    finite = summarize(history(*maes), first_nan_epoch=None, cfg=FLOAT32)
    assert finite["best_mae"] == min(maes) and finite["final_mae"] == maes[-1]


def test_the_first_epoch_past_the_factor_of_the_best_before_it_is_the_divergence():
    best = 0.2
    jump = best * DIVERGENCE_FACTOR * 1.01
    maes = (2.0, best, best * 2, jump, jump * 2, 0.3)
    found = divergence(history(*maes), None)
    assert (found.epoch, found.mae, found.best_before) == (4, jump, best)
    summary = summarize(history(*maes), None, FLOAT32)
    assert summary["diverged_epoch"] == 4
    for number in ("epoch 4", f"{jump:.3g}", f"{best:.3g}", f"{DIVERGENCE_FACTOR:g}x"):
        assert number in summary["warning"], number
    assert f"final MAE {maes[-1]:.3g}" in summary["warning"]


def test_a_jump_just_under_the_factor_is_no_divergence():
    best = 0.2
    summary = summarize(history(1.0, best, best * DIVERGENCE_FACTOR), None, FLOAT32)
    assert summary["diverged_epoch"] is None and summary["warning"] is None


def test_the_first_epoch_is_never_a_divergence_and_the_second_can_be():
    assert DIVERGENCE_MIN_EPOCH == 2  # the rule's documented minimum (docs/reports.md)
    assert divergence(history(50.0), None) is None
    found = divergence(history(0.1, 0.1 * DIVERGENCE_FACTOR * 2), None)
    assert found is not None and found.epoch == DIVERGENCE_MIN_EPOCH


def test_only_the_epochs_before_a_failure_can_diverge():
    maes = (1.0, 0.5, 0.5 * DIVERGENCE_FACTOR * 3)
    assert summarize(history(*maes), first_nan_epoch=3, cfg=FLOAT32)["diverged_epoch"] is None
    before = summarize(history(*maes, math.nan), first_nan_epoch=4, cfg=FLOAT32)
    assert before["diverged_epoch"] == 3
    assert "1 epoch(s) before the first failure" in before["warning"]


def test_divergence_is_appended_to_the_headroom_warning():
    records = history(1.0, 0.1, 0.1 * DIVERGENCE_FACTOR * 2)
    for record in records:
        record.max_exp_arg = 88.0  # within the margin of float32's overflow line, 88.72
    parts = summarize(records, None, FLOAT32)["warning"].split("; ")
    assert parts[0].startswith("largest exp argument 88.00")
    assert parts[1].startswith("validation MAE diverged at epoch 3")


@pytest.mark.parametrize("jit_compile", [False, True])
def test_the_xla_warning_follows_the_settings(jit_compile):
    records = history(1.0, 0.9)
    records[0].max_exp_arg = 50.0  # above half float32's overflow line, below its margin
    warning = summarize(records, None, RowSettings("float32", jit_compile))["warning"]
    assert (warning is not None) == jit_compile


def test_the_summary_has_exactly_the_summary_fields():
    assert tuple(summarize(history(1.0), None, FLOAT32)) == SUMMARY_FIELDS
