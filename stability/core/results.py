"""One training run's result row and per-epoch history; the CSV columns are their fields.

``RunResult``'s fields, in order, are the result CSV's columns, and ``EpochRecord``'s the
history CSV's (with the run's identity first and the dtype's exp lines): a column is added by
adding a field, at the end (stable names and order: users and CI depend on them).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, fields

from stability.core.failures import Failure, Kind
from stability.core.limits import exp_limits

#: How ``summary_line`` words a failure that is not a plain non-finite value.
_OUTCOMES = {
    Kind.NORMALIZATION.value: "attention weights not summing to 1",
    Kind.MASKED_GRADIENT.value: "non-finite gradient masked by the transform",
}


#: The metadata of a ``RunResult`` field that is not a CSV column.
_NOT_A_COLUMN = {"column": False}


@dataclass
class EpochRecord:
    """What one epoch left behind. Values are NaN where the epoch produced none."""

    epoch: int
    train_loss: float = math.nan
    val_mae: float = math.nan
    max_abs_logit: float = math.nan
    grad_norm: float = math.nan
    max_abs_weight: float = math.nan
    # Appended by issue 14 (the history CSV puts the dtype's exp lines after these two).
    #: The largest exp argument and the smallest per-node max logit, signed.
    max_exp_arg: float = math.nan
    min_node_max_logit: float = math.nan
    # Appended by issue 21.
    #: The largest |raw gradient| over the epoch's finite steps.
    max_abs_grad: float = math.nan

    @classmethod
    def from_row(cls, row: Mapping[str, object]) -> EpochRecord:
        """The record of a history row as the CSV spells it (text, empty for NaN); a column
        an older history lacks is NaN."""
        values = {f.name: _number(row.get(f.name, "")) for f in fields(cls) if f.name != "epoch"}
        return cls(int(row["epoch"]), **values)


@dataclass
class RunResult:
    """One training run. Epochs and steps count from 1; ``None`` means "did not happen"."""

    case: str
    variant: str
    seed: int
    dataset: str
    batch_size: int
    learning_rate: float
    epochs: int
    dtype: str
    first_nan_epoch: int | None = None
    first_nan_step: int | None = None
    first_nan_where: str | None = None
    first_nan_layer: str | None = None
    first_nan_op: str | None = None
    loss_nan_epoch: int | None = None
    final_mae: float | None = None
    best_mae: float | None = None
    mae_before_nan: float | None = None
    max_abs_logit: float | None = None
    wall_seconds: float = 0.0
    steps_per_second: float = 0.0
    tf_version: str = ""
    # Appended by issue 14; older CSVs lack them (readers fill them in, see ``missing``).
    #: What the first failure was: ``nonfinite``, ``normalization`` (attention weights not
    #: summing to 1), ``masked_gradient`` (a non-finite gradient the transform made finite)
    #: or ``input``; None for a run without one.
    failure_kind: str | None = None
    max_exp_arg: float | None = None
    min_node_max_logit: float | None = None
    #: Why a finite run is still suspect (near exp's limits), or None.
    warning: str | None = None
    # Appended by issue 21 (stability.train.cause).
    #: What kind of failure the first one was (``stability.train.cause.CAUSES``): e.g.
    #: ``forward underflow (0/0)``, ``gradient explosion``; ``none`` without one.
    failure_cause: str | None = None
    #: The failing step's global norm and largest |value| of the raw gradients (None where
    #: not finite, or without a failing step).
    failure_grad_norm: float | None = None
    failure_max_abs_grad: float | None = None
    # Appended by issue 25 (stability.core.environment).
    #: The libraries, thread layout and CPU the run trained on (``environment.describe``);
    #: rows of one environment compare exactly, others by what holds on any machine.
    environment: str = ""
    # Appended by issue 26 (stability.train.run_summary.divergence).
    #: The first epoch whose validation MAE exceeded ``DIVERGENCE_FACTOR`` x the best of
    #: the epochs before it, among the epochs before any failure; None if none did.
    diverged_epoch: int | None = None
    history: list[EpochRecord] = field(default_factory=list, repr=False, metadata=_NOT_A_COLUMN)
    #: The first failure as one typed record (``stability.core.failures.Failure``), where it
    #: was found in this process; its columns above are rendered from it. Not a column.
    failure: Failure | None = field(default=None, repr=False, compare=False, metadata=_NOT_A_COLUMN)

    def record_failure(self, failure: Failure) -> None:
        """Keep ``failure`` and fill the columns it renders (``Failure.columns``)."""
        self.failure = failure
        for name, value in failure.columns().items():
            setattr(self, name, value)

    @property
    def hit_nan(self) -> bool:
        return self.first_nan_epoch is not None

    def summary_line(self, data_index: int | None = None) -> str:
        """One line for the progress output: the run and how it ended."""
        label = f"{self.variant} seed={self.seed} bs={self.batch_size} lr={self.learning_rate:g}"
        if data_index is not None:
            label += f" data={data_index}"
        if self.first_nan_where == "input":
            outcome = f"not trained, non-finite input ({self.first_nan_layer})"
        else:
            outcome = f"NaN at epoch {self.first_nan_epoch}" if self.hit_nan else "finite"
            if self.hit_nan and self.failure_cause and self.failure_kind == Kind.NONFINITE:
                outcome += f" ({self.failure_cause})"
            if self.failure_kind in _OUTCOMES:
                outcome = f"{_OUTCOMES[self.failure_kind]} at epoch {self.first_nan_epoch}"
            if self.first_nan_where == "validation":
                outcome += " (validation)"
            if self.warning:
                outcome += f" (warning: {self.warning})"
        best = "-" if self.best_mae is None else f"{self.best_mae:.3f}"
        return f"{self.case}: {label}: {outcome}, best MAE {best}"

    def row(self) -> dict[str, object]:
        """The CSV row, keyed by ``RESULT_FIELDS``."""
        values = asdict(self)
        return {name: values[name] for name in RESULT_FIELDS}

    def history_rows(self) -> list[dict[str, object]]:
        """One row per epoch, keyed by ``HISTORY_FIELDS``."""
        ident = {name: getattr(self, name) for name in _HISTORY_IDENTITY}
        lines = exp_limits(self.dtype)
        extra = dict(zip(_EXP_LINE_FIELDS, (lines.overflow, -lines.underflow), strict=True))
        return [{**ident, **asdict(record), **extra} for record in self.history]


def cell(value: object) -> str:
    """How a value is spelled in our CSVs: empty for None and NaN, else ``str``."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return ""
    return str(value)


def _number(text: object) -> float:
    """A CSV cell read back as a float: NaN where it is empty."""
    return math.nan if text is None or text == "" else float(text)


#: The result columns, in CSV order: ``RunResult``'s fields but its history and its failure
#: record (whose columns are fields of their own). Every writer renders from this tuple.
RESULT_FIELDS = tuple(f.name for f in fields(RunResult) if f.metadata.get("column", True))

#: The columns that say when and where a run's first failure happened.
FIRST_NAN_FIELDS = RESULT_FIELDS[
    RESULT_FIELDS.index("first_nan_epoch") : RESULT_FIELDS.index("first_nan_op") + 1
]

#: The columns that say whether, when and where a run's first NaN happened: the first
#: failure's, then the epoch the loss itself went non-finite.
NAN_FIELDS = RESULT_FIELDS[
    RESULT_FIELDS.index("first_nan_epoch") : RESULT_FIELDS.index("loss_nan_epoch") + 1
]

#: Columns that depend on the machine's speed, left out when two runs are compared for
#: determinism or resumption.
TIMING_FIELDS = ("wall_seconds", "steps_per_second")

#: The run's identity at the head of every history row.
_HISTORY_IDENTITY = RESULT_FIELDS[: RESULT_FIELDS.index("learning_rate") + 1]
#: The dtype's exp lines beside each epoch's headroom (``exp_limits``), added by issue 14.
_EXP_LINE_FIELDS = ("exp_overflow_line", "exp_underflow_line")
_EPOCH_FIELDS = tuple(f.name for f in fields(EpochRecord))
_AFTER_EXP_LINES = _EPOCH_FIELDS.index("max_abs_grad")  # issue 21 appended it after them

#: Per-epoch history columns: the run's identity, then ``EpochRecord``'s fields with the exp
#: lines after issue 14's headroom.
HISTORY_FIELDS = (
    _HISTORY_IDENTITY
    + _EPOCH_FIELDS[:_AFTER_EXP_LINES]
    + _EXP_LINE_FIELDS
    + _EPOCH_FIELDS[_AFTER_EXP_LINES:]
)

#: Columns a CSV written before issue 14 lacks; ``report``/``compare``/``claims`` read such
#: CSVs by filling them with empty values.
ADDED_RESULT_FIELDS = RESULT_FIELDS[RESULT_FIELDS.index("tf_version") + 1 :]
ADDED_HISTORY_FIELDS = HISTORY_FIELDS[HISTORY_FIELDS.index("max_abs_weight") + 1 :]
