"""Plots of a case's history (matplotlib, Agg backend): PNG files the markdown links to.

- ``<case>.logits.png``: max |attention logit| per epoch, one line per run, coloured by
  variant, with the ``exp`` overflow and flush-to-zero underflow lines of the dtype.
- ``<case>.mae.png``: validation MAE per epoch, the same way.
- ``<case>.grads.png``: the largest |raw gradient| per epoch, log scale, with the line above
  which an optimizer's ``g * g`` overflows: a gradient explosion builds up toward it, a
  forward overflow does not (histories older than the column have no such plot).
"""

from __future__ import annotations

import math
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only, no display: works headless and in CI

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

from stability.core.files import atomic_writer
from stability.core.limits import exp_limits

#: The plots a case gets: file suffix -> (history column, y label, log scale).
PLOTS = {
    "logits": ("max_abs_logit", "max |attention logit| over the epoch (sign lost)", False),
    "mae": ("val_mae", "validation MAE (target units)", True),
    "grads": ("max_abs_grad", "max |raw gradient| over the epoch", True),
}


def write_plots(
    history: pd.DataFrame,
    out_dir: Path,
    case: str,
    dtype: str,
    nan_runs: frozenset[tuple] = frozenset(),
) -> list[Path]:
    """Write the case's PNGs into ``out_dir``; return their paths.

    ``nan_runs`` holds the (learning rate, batch size, variant, seed, data set) of runs that hit a
    NaN: their lines are drawn on top and end in an x.
    """
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = []
    for suffix, (column, label, log) in PLOTS.items():
        if column not in history or not history[column].notna().any():
            continue
        fig, ax = plt.subplots(figsize=(9, 5), dpi=110)
        _draw_runs(ax, history, column, nan_runs)
        if suffix == "logits":
            _draw_limits(ax, dtype)
        if suffix == "grads":
            _draw_explosion_line(ax, dtype)
        if log:
            ax.set_yscale("log")
        ax.set_xlabel("epoch")
        ax.set_ylabel(label)
        ax.set_title(f"{case}: {label} (one line per run)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8, ncol=2, loc="best")
        fig.tight_layout()
        path = out_dir / f"{case}.{suffix}.png"
        # Atomically, like every report file: a reader never sees half a PNG.
        with atomic_writer(path, "wb") as handle:
            fig.savefig(handle, format="png")
        plt.close(fig)
        paths.append(path)
    return paths


def _draw_runs(ax: plt.Axes, history: pd.DataFrame, column: str, nan_runs: frozenset) -> None:
    keys = ["learning_rate", "batch_size", "variant"]
    settings = history.groupby(keys, sort=False)
    several = history[["learning_rate", "batch_size"]].drop_duplicates().shape[0] > 1
    colors = plt.get_cmap("tab10" if settings.ngroups <= 10 else "tab20")
    for index, ((lr, batch_size, variant), group) in enumerate(settings):
        label = f"{variant} lr={lr:g} bs={batch_size}" if several else variant
        # One line per run: a seed on one data set (a case may train on several).
        for n, ((seed, dataset), run) in enumerate(group.groupby(["seed", "dataset"])):
            run = run.sort_values("epoch")
            # A variant identical to another until its NaN (raw_e and stable_softmax share
            # the math until exp leaves the range) would hide under it: NaN runs go on top.
            nan = (lr, batch_size, variant, seed, dataset) in nan_runs
            ax.plot(
                run["epoch"],
                run[column],
                color=colors(index % colors.N),
                # Earlier variants are drawn wider, so one that another covers exactly
                # (relu_e under raw_e: e > 0) still shows at the edges.
                linewidth=max(2.4 - 0.15 * index, 0.8),
                alpha=0.8,
                label=label if n == 0 else None,
                zorder=3 if nan else 2,
                marker="x" if nan else None,
                markevery=[len(run) - 1],
            )


def _draw_explosion_line(ax: plt.Axes, dtype: str) -> None:
    # The gradients' dtype: a mixed policy keeps float32 weights and gradients.
    storage = "float32" if dtype.startswith("mixed_") else dtype
    line = math.sqrt(float(np.finfo(np.dtype(storage)).max))
    ax.axhline(
        line,
        color="black",
        linestyle="--",
        linewidth=1,
        label=f"{storage} g * g overflows, |g| > {line:.3g}",
    )


def _draw_limits(ax: plt.Axes, dtype: str) -> None:
    limits = exp_limits(dtype)
    ax.plot([], [], "kx", linestyle="none", label="x: last epoch of a run that hit NaN")
    ax.axhline(
        limits.overflow,
        color="black",
        linestyle="--",
        linewidth=1,
        label=f"{limits.dtype} exp overflow, logit > +{limits.overflow:.2f}",
    )
    ax.axhline(
        limits.underflow,
        color="red",
        linestyle=":",
        linewidth=1.2,
        label=f"{limits.dtype} exp flushed to 0, logit < -{limits.underflow:.2f}",
    )
