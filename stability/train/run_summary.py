"""A run's figures: each epoch's summary of its steps, and the run's summary of its epochs."""

from __future__ import annotations

import time

import numpy as np

from stability.core.failures import Cause
from stability.core.limits import exp_limits
from stability.core.results import EpochRecord, RunResult
from stability.train.config import TrainConfig
from stability.train.guard import STATS

#: A finite run whose ``exp`` arguments came within this fraction of a limit gets a warning
#: (float32: above 79.85 or, for a node's largest logit, below -78.61).
WARNING_MARGIN = 0.1


def finish(
    result: RunResult, config: TrainConfig, started: float, steps: int, seconds: float
) -> None:
    """A run's summary fields, from its history: final, best and last-good MAE, the
    largest logit and ``exp`` arguments, the cause of no failure, the headroom warning and
    the timings."""
    maes = [r.val_mae for r in result.history]
    finite = [m for m in maes if np.isfinite(m)]
    # A run that hit a NaN has no final model a user could keep: final_mae stays empty.
    if not result.hit_nan and maes and np.isfinite(maes[-1]):
        result.final_mae = maes[-1]
    result.best_mae = min(finite) if finite else None
    if result.hit_nan and result.first_nan_epoch > 1:
        before = maes[result.first_nan_epoch - 2]
        result.mae_before_nan = before if np.isfinite(before) else None
    logits = [r.max_abs_logit for r in result.history if np.isfinite(r.max_abs_logit)]
    result.max_abs_logit = max(logits) if logits else None
    highs = [r.max_exp_arg for r in result.history if np.isfinite(r.max_exp_arg)]
    lows = [r.min_node_max_logit for r in result.history if np.isfinite(r.min_node_max_logit)]
    result.max_exp_arg = max(highs) if highs else None
    result.min_node_max_logit = min(lows) if lows else None
    if result.failure_cause is None:  # no failure: the cause says so
        result.failure_cause = Cause.NONE.value
    if not result.hit_nan:
        result.warning = headroom_warning(result.max_exp_arg, result.min_node_max_logit, config)
    result.wall_seconds = time.perf_counter() - started
    result.steps_per_second = steps / seconds if seconds > 0 else 0.0


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


def headroom_warning(high: float | None, low: float | None, cfg: TrainConfig) -> str | None:
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
