"""Whether two rows of the same run agree: exactly where their environments agree, else by
what must hold on any machine.

Two rows of one run (case, variant, seed, data set and settings) made in one environment
(``stability.core.environment``: the libraries, the thread layout, the CPU) are the same bit
for bit, timing aside: anything else is a change. Made in two environments, the float sums
round differently and the trajectories part, so only what rounding cannot move is compared:

- the verdict: whether the run failed;
- for a failed run, how: the failing stage, the kind and cause of the failure, the op;
- for a failed run, when: the first-failure epoch, within ``epoch_tolerance``, a fraction of
  the baseline's epoch measured as the spread that rounding alone causes
  (``stability.report.spread``), and at least one epoch.

The final MAE is compared across environments only with an ``mae_tolerance``: a long run's
MAE moves far more with the rounding than its epochs do (``docs/reports.md``).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

from stability.core.environment import differences, same_environment
from stability.core.results import TIMING_FIELDS

#: Columns never compared: the machine's speed, and the environment itself.
UNCOMPARED = (*TIMING_FIELDS, "environment")

#: What a failed run must keep on any machine (the "how" of its failure).
FAILURE_FIELDS = ("first_nan_where", "failure_kind", "failure_cause", "first_nan_op")

EXACT = "exact"
ACROSS = "across environments"


@dataclass(frozen=True)
class Agreement:
    """The outcome of comparing a new row with its base row."""

    #: ``exact`` or ``across environments``.
    kind: str
    #: Why that comparison: ``same environment`` or what the environments differ in.
    why: str
    #: What disagreed, one phrase each; empty when the rows agree.
    problems: tuple[str, ...] = ()

    @property
    def ok(self) -> bool:
        return not self.problems

    def describe(self) -> str:
        outcome = "agree" if self.ok else "disagree: " + "; ".join(self.problems)
        return f"{self.kind} comparison ({self.why}): {outcome}"


def kind_of(new_env: str, base_env: str) -> tuple[str, str]:
    """(kind, why) of comparing rows made in ``new_env`` with rows made in ``base_env``."""
    if same_environment(new_env, base_env):
        return EXACT, "same environment"
    return ACROSS, "environments differ: " + "; ".join(differences(new_env, base_env))


def compare_rows(
    new: Mapping[str, object],
    base: Mapping[str, object],
    epoch_tolerance: float,
    mae_tolerance: float | None = None,
    unstable: tuple[str, ...] = (),
) -> Agreement:
    """Compare ``new`` with ``base`` (two rows of one run, as CSV dicts or ``row()``s).

    Across environments, ``unstable`` names the columns of how a run failed that rounding
    alone was measured to change (``Spread.unstable_fields``); they are not compared."""
    kind, why = kind_of(_text(new.get("environment")), _text(base.get("environment")))
    if kind == EXACT:
        problems = tuple(
            f"{name} {_text(base.get(name))!r} -> {_text(new.get(name))!r}"
            for name in dict.fromkeys([*base, *new])
            if name not in UNCOMPARED and _text(new.get(name)) != _text(base.get(name))
        )
        return Agreement(kind, why, problems)
    problems = _across(new, base, epoch_tolerance, mae_tolerance, unstable)
    return Agreement(kind, why, tuple(problems))


def _across(new, base, epoch_tolerance, mae_tolerance, unstable) -> list[str]:
    failed_new, failed_base = _number(new, "first_nan_epoch"), _number(base, "first_nan_epoch")
    if math.isnan(failed_new) != math.isnan(failed_base):
        return ["now stays finite" if math.isnan(failed_new) else "now fails"]
    problems = []
    if not math.isnan(failed_base):
        problems += [
            f"{name} {_text(base.get(name))!r} -> {_text(new.get(name))!r}"
            for name in FAILURE_FIELDS
            # An empty base value was not recorded (a CSV older than the column).
            if name not in unstable
            and _text(base.get(name))
            and _text(new.get(name)) != _text(base.get(name))
        ]
        allowed = epoch_allowance(failed_base, epoch_tolerance)
        if abs(failed_new - failed_base) > allowed:
            problems.append(
                f"first failure at epoch {failed_base:g} -> {failed_new:g}, beyond the "
                f"{allowed:g} epoch(s) rounding moves it ({epoch_tolerance:.1%})"
            )
    if mae_tolerance is not None:
        mae_new, mae_base = _number(new, "final_mae"), _number(base, "final_mae")
        if not math.isnan(mae_base) and not math.isnan(mae_new) and mae_base > 0:
            worse = (mae_new - mae_base) / mae_base
            if worse > mae_tolerance:
                problems.append(f"final MAE worse by {worse:+.0%} (tolerance {mae_tolerance:.0%})")
    return problems


def epoch_allowance(base_epoch: float, tolerance: float) -> float:
    """How many epochs a first failure at ``base_epoch`` may move across environments: the
    measured fraction of it, and at least one epoch (a step that moves across an epoch's
    end moves the epoch by one, however small the rounding)."""
    return max(1.0, math.floor(tolerance * base_epoch + 1e-9))


def _text(value: object) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return ""
    return str(value)


def _number(row: Mapping[str, object], name: str) -> float:
    try:
        value = float(_text(row.get(name)) or "nan")
    except ValueError:
        return math.nan
    return value
