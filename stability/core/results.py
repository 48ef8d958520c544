"""One training run's result row and per-epoch history; the CSV columns are defined here."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field

from stability.core.failures import Failure
from stability.core.limits import exp_limits

#: The result columns, in CSV order. Every writer renders from this tuple (stable names:
#: users and CI depend on them).
RESULT_FIELDS = (
    "case",
    "variant",
    "seed",
    "dataset",
    "batch_size",
    "learning_rate",
    "epochs",
    "dtype",
    "first_nan_epoch",
    "first_nan_step",
    "first_nan_where",
    "first_nan_layer",
    "first_nan_op",
    "loss_nan_epoch",
    "final_mae",
    "best_mae",
    "mae_before_nan",
    "max_abs_logit",
    "wall_seconds",
    "steps_per_second",
    "tf_version",
    # Appended by issue 14; older CSVs lack them (readers fill them in, see ``missing``).
    "failure_kind",
    "max_exp_arg",
    "min_node_max_logit",
    "warning",
    # Appended by issue 21: what kind of failure it was (stability.train.cause), and the
    # failing step's raw gradient norm and largest |gradient|.
    "failure_cause",
    "failure_grad_norm",
    "failure_max_abs_grad",
    # Appended by issue 25: what the run's numbers depend on (stability.core.environment).
    "environment",
)

#: The columns that say whether, when and where a run's first NaN happened.
NAN_FIELDS = RESULT_FIELDS[
    RESULT_FIELDS.index("first_nan_epoch") : RESULT_FIELDS.index("loss_nan_epoch") + 1
]

#: Columns that depend on the machine's speed, left out when two runs are compared for
#: determinism or resumption.
TIMING_FIELDS = ("wall_seconds", "steps_per_second")

#: Per-epoch history columns.
HISTORY_FIELDS = (
    "case",
    "variant",
    "seed",
    "dataset",
    "batch_size",
    "learning_rate",
    "epoch",
    "train_loss",
    "val_mae",
    "max_abs_logit",
    "grad_norm",
    "max_abs_weight",
    # Appended by issue 14: signed headroom to exp's limits, next to the dtype's lines.
    "max_exp_arg",
    "min_node_max_logit",
    "exp_overflow_line",
    "exp_underflow_line",
    # Appended by issue 21: the largest |raw gradient| of the epoch, beside grad_norm.
    "max_abs_grad",
)

#: Columns a CSV written before issue 14 lacks; ``report``/``compare``/``claims`` read such
#: CSVs by filling them with empty values.
ADDED_RESULT_FIELDS = RESULT_FIELDS[RESULT_FIELDS.index("tf_version") + 1 :]
ADDED_HISTORY_FIELDS = HISTORY_FIELDS[HISTORY_FIELDS.index("max_abs_weight") + 1 :]


#: How ``summary_line`` words a failure that is not a plain non-finite value.
_OUTCOMES = {
    "normalization": "attention weights not summing to 1",
    "masked_gradient": "non-finite gradient masked by the transform",
}


@dataclass
class EpochRecord:
    """What one epoch left behind. Values are NaN where the epoch produced none."""

    epoch: int
    train_loss: float = math.nan
    val_mae: float = math.nan
    max_abs_logit: float = math.nan
    grad_norm: float = math.nan
    max_abs_weight: float = math.nan
    #: The largest exp argument and the smallest per-node max logit, signed.
    max_exp_arg: float = math.nan
    min_node_max_logit: float = math.nan
    #: The largest |raw gradient| over the epoch's finite steps.
    max_abs_grad: float = math.nan


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
    #: What the first failure was: ``nonfinite``, ``normalization`` (attention weights not
    #: summing to 1), ``masked_gradient`` (a non-finite gradient the transform made finite)
    #: or ``input``; None for a run without one.
    failure_kind: str | None = None
    max_exp_arg: float | None = None
    min_node_max_logit: float | None = None
    #: Why a finite run is still suspect (near exp's limits), or None.
    warning: str | None = None
    #: What kind of failure the first one was (``stability.train.cause.CAUSES``): e.g.
    #: ``forward underflow (0/0)``, ``gradient explosion``; ``none`` without one.
    failure_cause: str | None = None
    #: The failing step's global norm and largest |value| of the raw gradients (None where
    #: not finite, or without a failing step).
    failure_grad_norm: float | None = None
    failure_max_abs_grad: float | None = None
    #: The libraries, thread layout and CPU the run trained on (``environment.describe``);
    #: rows of one environment compare exactly, others by what holds on any machine.
    environment: str = ""
    history: list[EpochRecord] = field(default_factory=list, repr=False)
    #: The first failure as one typed record (``stability.core.failures.Failure``), where it
    #: was found in this process; its columns above are rendered from it. Not a column.
    failure: Failure | None = field(default=None, repr=False, compare=False)

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
            if self.hit_nan and self.failure_cause and self.failure_kind == "nonfinite":
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
        ident = {name: getattr(self, name) for name in HISTORY_FIELDS[:6]}
        lines = exp_limits(self.dtype)
        extra = {"exp_overflow_line": lines.overflow, "exp_underflow_line": -lines.underflow}
        return [{**ident, **asdict(record), **extra} for record in self.history]
