"""One per-variant aggregation of result rows, used by the case reports, claims and compare.

A *setting* is the rows that share ``keys`` (by default one variant at one learning rate
and batch size); ``settings`` groups a results frame into ``Setting`` objects, and every
median, count and range the reports print is a property of one.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd

from stability.core.failures import Kind, failure_cause

#: A setting of a case: one variant at one learning rate and batch size.
SETTING_KEYS = ("learning_rate", "batch_size", "variant")


@dataclass(frozen=True)
class Setting:
    """The result rows of one setting (``rows`` is a slice of a results frame)."""

    rows: pd.DataFrame

    @property
    def runs(self) -> int:
        return len(self.rows)

    @property
    def bad_input(self) -> pd.Series:
        """Runs that never trained: their data held NaN/Inf (``first_nan_where = input``)."""
        return self.rows["first_nan_where"] == "input"

    @property
    def training_nan(self) -> pd.Series:
        """Runs that hit a non-finite value in training (a bad input is never one)."""
        return self.rows["first_nan_epoch"].notna() & ~self.bad_input

    @property
    def nan_runs(self) -> int:
        return int(self.training_nan.sum())

    @property
    def input_runs(self) -> int:
        return int(self.bad_input.sum())

    @property
    def nan_epochs(self) -> pd.Series:
        """First-NaN epochs of the runs that hit one in training."""
        return self.rows.loc[self.training_nan, "first_nan_epoch"].astype(float)

    def first_failure(self, unit: str = "epoch") -> np.ndarray:
        """Per run, the first-NaN epoch (or optimizer step); ``inf`` for a run that stayed
        finite, so a median over runs counts those as later than any failure."""
        column = "first_nan_epoch" if unit == "epoch" else "first_nan_step"
        return np.where(self.training_nan, self.rows[column], np.inf).astype(float)

    @property
    def budget_epochs(self) -> int:
        return int(self.rows["epochs"].max())

    @property
    def final_maes(self) -> pd.Series:
        """Final MAEs of the runs that have one (a run stopped at a NaN has none)."""
        return self.rows["final_mae"].dropna()

    @property
    def final_mae(self) -> float:
        """Median final MAE, NaN if no run has one."""
        values = self.final_maes
        return float(values.median()) if len(values) else math.nan

    def median(self, column: str) -> float:
        values = self.rows[column].dropna()
        return float(values.median()) if len(values) else math.nan

    def wheres(self) -> tuple[str, ...]:
        """The stages of the runs' first failures; a failure that is no non-finite value
        (``failure_kind`` normalization or masked_gradient) is named with its kind."""
        failed = self.rows.loc[self.training_nan]
        kinds = failed.get("failure_kind", pd.Series(index=failed.index, dtype=object))
        labels = set()
        for where, kind in zip(failed["first_nan_where"], kinds, strict=True):
            if pd.isna(where):
                continue
            special = isinstance(kind, str) and kind not in (Kind.NONFINITE, Kind.INPUT)
            labels.add(f"{where} ({kind.replace('_', ' ')})" if special else where)
        return tuple(sorted(labels))

    @property
    def warnings(self) -> pd.Series:
        """The warnings of the setting's finite runs (near exp's limits), empty if none."""
        if "warning" not in self.rows.columns:
            return pd.Series(dtype=object)
        return self.rows.loc[~self.training_nan & ~self.bad_input, "warning"].dropna()

    @property
    def diverged(self) -> pd.DataFrame:
        """The trained runs whose validation MAE diverged before any failure
        (``diverged_epoch``, issue 26); none for rows older than the column."""
        if "diverged_epoch" not in self.rows.columns:
            return self.rows.iloc[:0]
        return self.rows.loc[self.rows["diverged_epoch"].notna() & ~self.bad_input]

    def sites(self) -> dict[tuple[str, str], int]:
        """(layer, op) of the runs' first failures in training, with how many runs each."""
        failed = self.rows.loc[self.training_nan, ["first_nan_layer", "first_nan_op"]]
        pairs = failed.fillna("-").astype(str).itertuples(index=False, name=None)
        counts: dict[tuple[str, str], int] = {}
        for pair in pairs:
            counts[pair] = counts.get(pair, 0) + 1
        return dict(sorted(counts.items()))

    def ops(self) -> tuple[str, ...]:
        return tuple(sorted(set(self.rows.loc[self.training_nan, "first_nan_op"].dropna())))

    def causes(self) -> tuple[str, ...]:
        """The causes of the runs' first failures in training, sorted, each read by
        ``core.failures.failure_cause`` (rows older than the ``failure_cause`` column
        included)."""
        failed = self.rows.loc[self.training_nan]
        return tuple(sorted({failure_cause(row) for _, row in failed.iterrows()}))

    @property
    def stayed_finite(self) -> bool:
        """No run hit a NaN in training."""
        return self.nan_runs == 0


def settings(
    frame: pd.DataFrame, keys: Sequence[str] = SETTING_KEYS
) -> list[tuple[tuple, Setting]]:
    """``(key values, Setting)`` per group of ``keys``, in the order rows first appear."""
    return [
        (key if isinstance(key, tuple) else (key,), Setting(group))
        for key, group in frame.groupby(list(keys), sort=False)
    ]


def best_finite(frame: pd.DataFrame) -> tuple[str, float] | None:
    """(variant, median final MAE) of the best setting none of whose runs hit a NaN."""
    medians = {
        key[-1]: s.final_mae
        for key, s in settings(frame)
        if s.stayed_finite and s.input_runs == 0 and len(s.final_maes)
    }
    if not medians:
        return None
    variant = min(medians, key=medians.get)
    return variant, float(medians[variant])
