"""Risk per variant: how fast max |attention logit| grows, and when it would reach ``exp``'s
limit.

A run that stayed finite within its epoch budget may only have delayed its NaN. The trend
of its max |logit| over the last half of its epochs (a least-squares line, per run) says by
how much: the epoch at which that line crosses the nearer ``exp`` line of the run's dtype
(``stability.core.limits``). A variant whose finite runs cross it a few budgets later only
delays the NaN; one whose logits do not grow is not at risk from ``exp``.

Direction: a history with the signed headroom columns (``max_exp_arg``, the largest
``exp`` argument, and ``min_node_max_logit``, the smallest per-node max logit) gets two
trends per run, the first toward the dtype's overflow line (``+log(max)``), the second
toward its underflow line (``log(tiny)``, a whole segment's ``exp`` flushed to 0), and the
earlier crossing counts. A history written before those columns has max |logit| alone,
whose sign is lost: its distance is to the nearer of the two lines.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from stability.core.limits import ExpLimits, exp_limits

#: The fraction of a run's epochs, counted from its end, that its trend is fitted to: the
#: early epochs of training move fast and say little about where the logits are heading.
TREND_FRACTION = 0.5

#: The fewest epochs a finite run needs before its trend is extrapolated: the line is fitted
#: to the last ``TREND_FRACTION`` of them, so 20 epochs give it 10 points. A 5-epoch run's
#: line through 3 early points once "crossed at epoch 3850"; that is no evidence of anything.
MIN_TREND_EPOCHS = 20

#: The history's attention-logit figures: all NaN for a run whose model exposes no logits.
LOGIT_COLUMNS = ("max_abs_logit", "max_exp_arg", "min_node_max_logit")

#: What the Risk table shows where no run of a variant recorded a logit (not "+nan").
ABSENT = "—"

#: Grouping of runs into the rows of a report.
GROUP_KEYS = ["learning_rate", "batch_size", "variant"]


def logit_trend(epochs: np.ndarray, max_abs_logit: np.ndarray) -> tuple[float, float]:
    """(slope per epoch, intercept) of the least-squares line through the last
    ``TREND_FRACTION`` of the finite points; NaNs if fewer than two remain.

    Shapes: ``epochs`` and ``max_abs_logit`` are ``[num_epochs]``.
    """
    keep = np.isfinite(max_abs_logit)
    epochs, values = epochs[keep], max_abs_logit[keep]
    start = int(len(epochs) * (1 - TREND_FRACTION))
    epochs, values = epochs[start:], values[start:]
    if len(epochs) < 2:
        return math.nan, math.nan
    slope, intercept = np.polyfit(epochs.astype(np.float64), values.astype(np.float64), 1)
    return float(slope), float(intercept)


def crossing_epoch(slope: float, intercept: float, line: float) -> float:
    """The epoch at which ``intercept + slope * epoch`` reaches ``line``; inf if it never
    grows."""
    if not math.isfinite(slope) or slope <= 0:
        return math.inf
    return (line - intercept) / slope


#: The signed headroom columns and the line each heads for: (column, sign, line name).
SIGNED = (("max_exp_arg", 1.0, "overflow"), ("min_node_max_logit", -1.0, "underflow"))


def run_risks(results: pd.DataFrame, history: pd.DataFrame) -> pd.DataFrame:
    """One row per run: its trend, the line it is heading for and when it would cross it."""
    # A run is one seed on one data set (a case may train on several data sets).
    keys = ["variant", "seed", "dataset", "batch_size", "learning_rate"]
    dtypes = results.set_index(keys)["dtype"]
    finals = results.set_index(keys)["first_nan_epoch"]
    rows = []
    for key, run in history.groupby(keys, sort=False):
        run = run.sort_values("epoch")
        limits = exp_limits(str(dtypes.get(key, "float32")))
        epochs = run["epoch"].to_numpy()
        if all(c in run.columns and run[c].notna().any() for c, _, _ in SIGNED):
            trend = _signed_trend(epochs, run, limits)
        else:
            slope, intercept = logit_trend(epochs, run["max_abs_logit"].to_numpy())
            name, line = limits.nearest
            trend = {
                "slope": slope,
                "line": line,
                "line_name": name,
                "line_label": f"{line:.2f} ({name})",
                "peak": float(run["max_abs_logit"].max()),
                "crossing": crossing_epoch(slope, intercept, line),
            }
        hit = finals.get(key)
        hit_nan = hit is not None and not pd.isna(hit)
        # A model that exposes no attention logits (the forward contract) records NaN for
        # every epoch's logit figures: there is no trend, and no line it heads for.
        logits = any(run[c].notna().any() for c in LOGIT_COLUMNS if c in run.columns)
        last_epoch = int(run["epoch"].max())
        if not hit_nan and last_epoch < MIN_TREND_EPOCHS:
            trend["crossing"] = math.nan  # too short to extrapolate (MIN_TREND_EPOCHS)
        rows.append(
            {
                **dict(zip(keys, key, strict=True)),
                **trend,
                "hit_nan": hit_nan,
                "last_epoch": last_epoch,
                "logits": logits,
            }
        )
    return pd.DataFrame(rows)


def _signed_trend(epochs: np.ndarray, run: pd.DataFrame, limits: ExpLimits) -> dict:
    """The trend toward the overflow and toward the underflow line; the earlier crossing
    (or, if neither is crossed, the one nearer its line) is the run's."""
    options = []
    for column, sign, name in SIGNED:
        line = limits.overflow if name == "overflow" else limits.underflow
        values = sign * run[column].to_numpy(dtype=np.float64)
        slope, intercept = logit_trend(epochs, values)
        peak = float(np.nanmax(values))
        options.append(
            {
                "slope": slope,
                "line": line,
                "line_name": name,
                "line_label": f"{sign * line:+.2f} ({name})",
                "peak": peak,
                "crossing": crossing_epoch(slope, intercept, line),
            }
        )
    return min(options, key=lambda o: (o["crossing"], -o["peak"] / o["line"]))


def risk_table(results: pd.DataFrame, history: pd.DataFrame) -> pd.DataFrame:
    """One row per (learning rate, batch size, variant) with its risk line."""
    runs = run_risks(results, history)
    rows = []
    for (lr, batch_size, variant), group in results.groupby(GROUP_KEYS, sort=False):
        variant_runs = runs[
            (runs["variant"] == variant)
            & (runs["batch_size"] == batch_size)
            & (runs["learning_rate"] == lr)
        ]
        if variant_runs.empty:
            continue
        budget = int(group["epochs"].max())
        seen = variant_runs[_with_logits(variant_runs)]
        rows.append(
            {
                "variant": variant,
                "lr": f"{lr:g}",
                "batch": int(batch_size),
                "max abs logit growth per epoch, median": (
                    f"{seen['slope'].median():+.3f}" if len(seen) else ABSENT
                ),
                "line": seen["line_label"].mode().iloc[0] if len(seen) else ABSENT,
                "trend crosses it at epoch (finite runs), median": _crossing(seen),
                "risk": risk_line(variant_runs, budget),
            }
        )
    table = pd.DataFrame(rows)
    for column in ("lr", "batch"):
        if not table.empty and table[column].nunique() == 1:
            table = table.drop(columns=column)
    return table


def _with_logits(runs: pd.DataFrame) -> pd.Series:
    """The runs that recorded an attention logit (all of a frame without the column)."""
    if "logits" not in runs:
        return pd.Series(True, index=runs.index)
    return runs["logits"].astype(bool)


def _crossing(runs: pd.DataFrame) -> str:
    if runs.empty:
        return ABSENT
    finite = runs.loc[~runs["hit_nan"] & ~(runs["peak"] > runs["line"]), "crossing"].dropna()
    if finite.empty:
        return "-"
    median = finite.median()
    return "never" if math.isinf(median) else f"{median:.0f}"


def risk_line(runs: pd.DataFrame, budget: int) -> str:
    """A sentence on one variant's runs: NaN, delayed NaN, or no growth toward the line."""
    hits = int(runs["hit_nan"].sum())
    parts = []
    if hits:
        parts.append(f"NaN in {hits}/{len(runs)} runs")
    seen = _with_logits(runs)
    if not seen.all():
        parts.append(
            f"{int((~seen).sum())}/{len(runs)} run(s) recorded no attention logit (the model "
            "exposes none): no trend toward exp's lines"
        )
        runs = runs[seen]
    finite = runs.loc[~runs["hit_nan"], "crossing"]
    past = runs.loc[~runs["hit_nan"] & (runs["peak"] > runs["line"])]
    if not past.empty:
        # exp never saw these logits raw (a max-subtracted softmax, say): the line does
        # not bound them, so their growth is no risk of this kind.
        parts.append(
            f"{len(past)} finite run(s) went past the line and stayed finite: "
            "exp does not see the raw logit"
        )
        finite = finite.drop(past.index)
    short = finite[finite.isna()]
    if not short.empty:
        parts.append(
            f"{len(short)} finite run(s) too short to extrapolate (under {MIN_TREND_EPOCHS} epochs)"
        )
        finite = finite.dropna()
    if not finite.empty:
        median = finite.median()
        if math.isinf(median) or median > 10 * budget:
            parts.append("finite runs: logits not heading for the line")
        else:
            parts.append(
                f"finite runs only delay it: trend reaches the line near epoch {median:.0f} "
                f"({median / budget:.1f}x the {budget}-epoch budget)"
            )
    return "; ".join(parts)
