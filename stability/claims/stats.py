"""A claim case's rows, read as the numbers the claims' rules test.

``Stats`` are one setting's runs (one variant at one batch size and learning rate);
``ClaimInputs`` the claim cases' rows; ``SeedReading`` and ``SweepReading`` what a claim's
rule reads of one case (``claims.Reads`` says which): every variant at the seed's batch size
and learning rate, or the reference variant across the batch sizes or learning rates a case
varies.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pandas as pd

from stability.report.summary import Setting

#: The variant every claim is judged against: the seed's model as the seed wrote it.
REFERENCE = "raw_e"


@dataclass(frozen=True)
class Stats:
    """A setting's runs (one variant at one batch size and learning rate)."""

    runs: int
    nans: int
    epochs: np.ndarray  # first-NaN epoch per run, inf for runs that stayed finite
    steps: np.ndarray  # first-NaN step per run, inf likewise
    budget_epochs: int
    budget_steps: int
    final_mae: float  # median over the runs that stayed finite, NaN if none
    max_logit: float  # median of the runs' max |attention logit|
    wheres: tuple[str, ...]
    ops: tuple[str, ...]
    dtype: str = "float32"
    #: The failing runs' causes (``core.failures.failure_cause``: rows older than the
    #: ``failure_cause`` column are read from the columns they have).
    causes: tuple[str, ...] = ()

    @property
    def median_epoch(self) -> float:
        return float(np.median(self.epochs)) if self.runs else math.nan

    @property
    def median_step(self) -> float:
        return float(np.median(self.steps)) if self.runs else math.nan

    def describe(self) -> str:
        nan = f"NaN in {self.nans}/{self.runs}"
        if self.nans:
            hit = self.epochs[np.isfinite(self.epochs)]
            low, high = number(hit.min()), number(hit.max())
            nan += f", first at epoch {number(np.median(hit))} [{low}-{high}]"
        return (
            f"{nan} (budget {self.budget_epochs} epochs); max abs logit {self.max_logit:.1f}; "
            f"final MAE {number(self.final_mae)}"
        )


def setting_stats(
    frame: pd.DataFrame,
    variant: str,
    steps_per_epoch: int,
    batch_size: int | None = None,
    learning_rate: float | None = None,
) -> Stats | None:
    """The ``Stats`` of ``variant``'s rows (at ``batch_size``/``learning_rate`` if given)."""
    rows = frame[frame["variant"] == variant]
    if batch_size is not None:
        rows = rows[rows["batch_size"] == batch_size]
    if learning_rate is not None:
        rows = rows[np.isclose(rows["learning_rate"], learning_rate)]
    if rows.empty:
        return None
    s = Setting(rows)
    return Stats(
        runs=s.runs,
        nans=s.nan_runs,
        epochs=s.first_failure("epoch"),
        steps=s.first_failure("step"),
        budget_epochs=s.budget_epochs,
        budget_steps=s.budget_epochs * steps_per_epoch,
        final_mae=s.final_mae,
        max_logit=s.median("max_abs_logit"),
        wheres=s.wheres(),
        ops=s.ops(),
        causes=s.causes(),
        dtype=str(rows["dtype"].iloc[0]) if "dtype" in rows else "float32",
    )


def number(value: float) -> str:
    """A number to 4 significant digits, '-' for a missing or infinite one."""
    return "-" if value is None or not math.isfinite(value) else f"{value:.4g}"


#: The claim cases (``cases/<name>.toml``), each a field of ``ClaimInputs``.
CLAIM_CASES = ("seed", "batch_size", "learning_rate")


@dataclass(frozen=True)
class ClaimInputs:
    """The claim cases' rows (None where a case was not run) and their steps per epoch."""

    seed: pd.DataFrame | None
    batch_size: pd.DataFrame | None
    learning_rate: pd.DataFrame | None
    train_graphs: int
    seed_batch_size: int = 32
    seed_learning_rate: float = 1e-2

    def steps_per_epoch(self, batch_size: int) -> int:
        return math.ceil(self.train_graphs / batch_size)

    def rows(self, case: str) -> pd.DataFrame | None:
        """The rows of claim case ``case`` (one of ``CLAIM_CASES``), None if not run."""
        if case not in CLAIM_CASES:
            raise ValueError(f"{case!r} is not a claim case ({', '.join(CLAIM_CASES)})")
        return getattr(self, case)

    def seed_stats(self, variant: str, case: str = "seed") -> Stats | None:
        """``variant``'s ``Stats`` in ``case`` at the seed's batch size and learning rate."""
        frame = self.rows(case)
        if frame is None:
            return None
        return setting_stats(
            frame,
            variant,
            self.steps_per_epoch(self.seed_batch_size),
            self.seed_batch_size,
            self.seed_learning_rate,
        )


@dataclass(frozen=True)
class SeedReading:
    """A case at the seed's setting: the reference's ``Stats`` and every variant's."""

    raw: Stats
    stats: dict[str, Stats | None]


def seed_reading(inputs: ClaimInputs, case: str = "seed") -> SeedReading | str:
    """The reading, or why the case's claims are not run."""
    raw = inputs.seed_stats(REFERENCE, case)
    if raw is None:
        return f"cases/{case}.toml has no {REFERENCE} rows"
    variants = inputs.rows(case)["variant"].unique()
    return SeedReading(raw, {v: inputs.seed_stats(v, case) for v in variants})


@dataclass(frozen=True)
class SweepReading:
    """One variant across the values of the setting a case varies, each against the first."""

    unit: str  # a value's name in the numbers: "batch" or "lr"
    change: str  # the sweep in words: "A larger batch", "A lower learning rate"
    #: Whether the steps per epoch change with the value, so a delay per step tells more.
    per_step: bool
    base: Stats  # at the first value: the smallest batch, the largest learning rate
    others: tuple[tuple[float, Stats], ...]  # (value, Stats) at each other value, in order
    numbers: str  # every value's Stats, in words


def sweep_reading(
    inputs: ClaimInputs, case: str, varies: str, variant: str = REFERENCE
) -> SweepReading | str:
    """``variant`` across ``case``'s ``varies`` (``batch_size`` or ``learning_rate``), or
    why the case's claims are not run."""
    frame = inputs.rows(case)
    if frame is None:
        return f"cases/{case}.toml was not run"
    if varies == "batch_size":
        sizes = sorted(frame["batch_size"].unique())
        found = [(s, setting_stats(frame, variant, inputs.steps_per_epoch(s), s)) for s in sizes]
        unit, change, per_step = "batch", "A larger batch", True
    elif varies == "learning_rate":
        rates = sorted(frame["learning_rate"].unique(), reverse=True)
        per_epoch = inputs.steps_per_epoch(int(frame["batch_size"].iloc[0]))
        found = [(r, setting_stats(frame, variant, per_epoch, learning_rate=r)) for r in rates]
        unit, change, per_step = "lr", "A lower learning rate", False
    else:
        raise ValueError(f"a claim case varies batch_size or learning_rate, not {varies!r}")
    (first, base), others = found[0], found[1:]
    if base is None:
        return f"no {variant} rows"

    def label(value: float) -> str:
        return f"batch {value}" if unit == "batch" else f"lr {value:g}"

    def steps(s: Stats) -> str:
        median, theirs = number(s.median_step), number(base.median_step)
        return f"; median first-NaN step {median} vs {theirs}" if per_step else ""

    parts = [f"{label(first)}: {base.describe()}"]
    parts += [f"{label(value)}: {s.describe()}{steps(s)}" for value, s in others]
    return SweepReading(unit, change, per_step, base, tuple(others), "; ".join(parts))
