"""A run's figures: each epoch's summary of its steps, and the run's summary of its epochs."""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from stability.core.failures import Cause
from stability.core.limits import exp_limits
from stability.core.results import EpochRecord, RunResult, cell
from stability.train.config import TrainConfig
from stability.train.guard import STATS

#: A finite run whose ``exp`` arguments came within this fraction of a limit gets a warning
#: (float32: above 79.85 or, for a node's largest logit, below -78.61).
WARNING_MARGIN = 0.1


def finish(
    result: RunResult, config: TrainConfig, started: float, steps: int, seconds: float
) -> None:
    """A run's summary fields from its history (``summarize``), the cause of no failure and
    the timings."""
    for name, value in summarize(result.history, result.first_nan_epoch, config).items():
        setattr(result, name, value)
    if result.failure_cause is None:  # no failure: the cause says so
        result.failure_cause = Cause.NONE.value
    result.wall_seconds = time.perf_counter() - started
    result.steps_per_second = steps / seconds if seconds > 0 else 0.0


class SummarySettings(Protocol):
    """What a run's summary depends on besides its history: its dtype (``exp``'s lines) and
    whether XLA compiled its step (the XLA warning). ``TrainConfig`` is one."""

    @property
    def dtype(self) -> str: ...

    @property
    def jit_compile(self) -> bool: ...


@dataclass(frozen=True)
class RowSettings:
    """``SummarySettings`` of a row read back from a CSV: the dtype is a column, whether XLA
    compiled the step is not (it is the case's ``jit_compile``)."""

    dtype: str
    jit_compile: bool = False


#: The columns ``summarize`` computes, in ``RESULT_FIELDS`` order.
SUMMARY_FIELDS = (
    "final_mae",
    "best_mae",
    "mae_before_nan",
    "max_abs_logit",
    "max_exp_arg",
    "min_node_max_logit",
    "warning",
    "diverged_epoch",
)


def summarize(
    history: Sequence[EpochRecord], first_nan_epoch: int | None, cfg: SummarySettings
) -> dict[str, object]:
    """A run's ``SUMMARY_FIELDS`` from its history and the epoch of its first failure (None
    for a run without one): final, best and last-good MAE, the largest logit and ``exp``
    arguments, the divergence and the warning.

    Best MAE and divergence read only the epochs a user could have kept: those completed
    before the failing epoch (``kept_epochs``); a run failing in epoch 1 has no best MAE.
    """
    hit_nan = first_nan_epoch is not None
    maes = {r.epoch: r.val_mae for r in history}
    kept = [m for m in (maes[e] for e in kept_epochs(history, first_nan_epoch)) if np.isfinite(m)]
    last = history[-1].val_mae if history else math.nan
    before = maes.get(first_nan_epoch - 1, math.nan) if hit_nan else math.nan
    found = divergence(history, first_nan_epoch)
    headroom = None
    summary: dict[str, object] = {
        # A run that hit a NaN has no final model a user could keep: final_mae stays empty.
        "final_mae": last if not hit_nan and np.isfinite(last) else None,
        "best_mae": min(kept) if kept else None,
        "mae_before_nan": before if np.isfinite(before) else None,
        "max_abs_logit": _extreme(history, "max_abs_logit", max),
        "max_exp_arg": _extreme(history, "max_exp_arg", max),
        "min_node_max_logit": _extreme(history, "min_node_max_logit", min),
        "diverged_epoch": found.epoch if found else None,
    }
    if not hit_nan:
        high, low = summary["max_exp_arg"], summary["min_node_max_logit"]
        headroom = headroom_warning(high, low, cfg)
    parts = [headroom, found and found.sentence(first_nan_epoch, summary["final_mae"])]
    summary["warning"] = "; ".join(p for p in parts if p) or None
    return {name: summary[name] for name in SUMMARY_FIELDS}


def resummarize(
    row: Mapping[str, str], history: Sequence[Mapping[str, str]], jit_compile: bool = False
) -> dict[str, str]:
    """``row``, a result row as the CSV spells it, with its ``SUMMARY_FIELDS`` computed again
    by ``summarize`` from its ``history`` rows (spelled the same way): what ``finish`` would
    have written. ``jit_compile`` is the case's (no column records it)."""
    records = [EpochRecord.from_row(h) for h in sorted(history, key=lambda h: int(h["epoch"]))]
    first = row["first_nan_epoch"]
    settings = RowSettings(str(row["dtype"]), jit_compile)
    summary = summarize(records, int(first) if first else None, settings)
    return {**row, **{name: cell(value) for name, value in summary.items()}}


def _extreme(history: Sequence[EpochRecord], name: str, pick: Callable) -> float | None:
    """The largest (``pick=max``) or smallest finite ``name`` of the epochs, or None."""
    values = [getattr(r, name) for r in history if np.isfinite(getattr(r, name))]
    return pick(values) if values else None


def kept_epochs(history: Sequence[EpochRecord], first_nan_epoch: int | None) -> list[int]:
    """The epochs whose model a user could have kept: every epoch of a run without a
    failure; for one with a failure, the epochs completed before the failing one (the
    failing epoch's validation ran on a model cut short mid-epoch, and with
    ``stop_at_nan = false`` the later ones on weights that went through a bad update)."""
    epochs = [r.epoch for r in history]
    return epochs if first_nan_epoch is None else [e for e in epochs if e < first_nan_epoch]


#: A run diverged at the first kept epoch whose validation MAE exceeds this many times the
#: best validation MAE of the epochs before it. Why 10, an order of magnitude: over the 559
#: runs of the committed histories (2026-12-02), the largest jump of a run that was not
#: diverging was 7.5x (raw_e at batch size 256 in batch_size: 6.73 at epoch 115 against a
#: best of 0.90, back to 0.90 by epoch 124), and the ordinary epoch-to-epoch noise stays
#: under 5x; the runs that lost their model went 49x to 112x (stable_softmax in float64)
#: and 87x (the seed case's stable_softmax seed 0 in the rows of before 29eef6e: 20.1
#: against 0.23). Ten flags neither the noise nor the recovered spike, and catches a
#: model that lost a decade of accuracy; a lower factor would flag the noise of long runs.
DIVERGENCE_FACTOR = 10.0

#: No minimum epoch beyond the first (which has no epoch before it): validation MAE falls
#: fastest in the first epochs, so an early best is a high one and a jump of
#: ``DIVERGENCE_FACTOR`` over it is harder, not easier, to reach; a longer wait would hide
#: a divergence in the short runs of smoke and map cases (3 to 10 epochs).
DIVERGENCE_MIN_EPOCH = 2


@dataclass(frozen=True)
class Divergence:
    """The first diverged epoch: its validation MAE and the best before it."""

    epoch: int
    mae: float
    best_before: float

    def sentence(self, first_nan_epoch: int | None, final_mae: float | None) -> str:
        """The warning naming the epoch, the MAE, the best before and the factor."""
        if first_nan_epoch is not None:
            after = f"{first_nan_epoch - self.epoch} epoch(s) before the first failure"
        elif final_mae is not None:
            after = f"no NaN; final MAE {final_mae:.3g}"
        else:
            after = "no NaN"
        return (
            f"validation MAE diverged at epoch {self.epoch}: {self.mae:.3g}, over "
            f"{DIVERGENCE_FACTOR:g}x the best of the epochs before it ({self.best_before:.3g}); "
            f"{after}"
        )


def divergence(history: Sequence[EpochRecord], first_nan_epoch: int | None) -> Divergence | None:
    """The first kept epoch (``kept_epochs``) from ``DIVERGENCE_MIN_EPOCH`` on whose
    validation MAE exceeds ``DIVERGENCE_FACTOR`` x the best finite validation MAE of the
    epochs before it, or None."""
    maes = {r.epoch: r.val_mae for r in history}
    best = math.inf
    for epoch in kept_epochs(history, first_nan_epoch):
        mae = maes[epoch]
        if not np.isfinite(mae):
            continue
        if epoch >= DIVERGENCE_MIN_EPOCH and mae > DIVERGENCE_FACTOR * best:
            return Divergence(epoch, mae, best)
        best = min(best, mae)
    return None


def summarize_epoch(record: EpochRecord, stats: list[np.ndarray]) -> None:
    """Mean loss and gradient norm, max |logit| and |weight|, the largest ``exp`` argument
    and the smallest per-node max logit over the epoch's finite steps."""
    if not stats:
        return
    table = np.array(stats, dtype=np.float64)  # [steps, 8], columns as guard.STATS
    with np.errstate(all="ignore"):
        finite = np.where(np.isfinite(table), table, np.nan)
        for name, reduce in _EPOCH_FIGURES:
            column = finite[:, STATS.index(name)]
            if np.isfinite(column).any():
                setattr(record, _RECORD_NAME.get(name, name), float(reduce(column)))


#: How an epoch's figure is made of its steps' (``guard.STATS``), in the order they are set.
_EPOCH_FIGURES = (
    ("loss", np.nanmean),
    ("max_abs_logit", np.nanmax),
    ("max_abs_weight", np.nanmax),
    ("max_exp_arg", np.nanmax),
    ("max_abs_grad", np.nanmax),
    ("min_node_max_logit", np.nanmin),
    ("grad_norm", np.nanmean),
)
#: ``EpochRecord``'s name of a statistic, where it differs from the step's.
_RECORD_NAME = {"loss": "train_loss"}


def headroom_warning(high: float | None, low: float | None, cfg: SummarySettings) -> str | None:
    """The warning of a run that stayed finite but came near ``exp``'s limits, or None.

    Near: within ``WARNING_MARGIN`` of the dtype's overflow line (``high``, the largest
    ``exp`` argument) or underflow line (``low``, the smallest per-node max logit). Under
    XLA, also above half the overflow line (float32: +44.36), where XLA's softmax gradient
    ``-x / (y * y)`` is finite but wrong (tests/test_xla.py measures it).
    """
    limits = exp_limits(cfg.dtype)
    parts = []
    if high is not None and high > limits.overflow * (1 - WARNING_MARGIN):
        parts.append(
            f"largest exp argument {high:.2f} within {WARNING_MARGIN:.0%} of the "
            f"{cfg.dtype} overflow line {limits.overflow:.2f}"
        )
    elif cfg.jit_compile and high is not None and high > limits.overflow / 2:
        parts.append(
            f"largest exp argument {high:.2f} above {limits.overflow / 2:.2f}, half the "
            f"{cfg.dtype} overflow line: XLA's softmax gradient is finite but wrong there"
        )
    if low is not None and low < -limits.underflow * (1 - WARNING_MARGIN):
        parts.append(
            f"smallest per-node max logit {low:.2f} within {WARNING_MARGIN:.0%} of the "
            f"{cfg.dtype} underflow line {-limits.underflow:.2f}"
        )
    return "; ".join(parts) or None
