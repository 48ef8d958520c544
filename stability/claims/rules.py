"""The verdict rules: ``Rules``' thresholds, the tests they make on ``Stats``, and one rule
function per kind of claim.

A rule function takes the variant its claim is about, the reading of the claim's case
(``claim_stats.SeedReading`` or ``SweepReading``) and the ``Rules``, and returns an
``Outcome``: whether the claim holds (None: it cannot be judged), the numbers it was judged
from, and why it does not hold. ``claims.CLAIM_TABLE`` names each claim's rule. Nothing here
knows an expected answer.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from stability.claims.stats import SeedReading, Stats, SweepReading
from stability.claims.stats import number as _number
from stability.core.failures import Cause
from stability.core.limits import exp_limits
from stability.report.verdicts import DELAY_FACTOR
from stability.report.verdicts import delays as delays_rule

#: The seed's "after about 30 epochs" (the *about N epochs* rule's N).
STATED_EPOCHS = 30

#: The failure causes of a forward failure (``stability.core.failures.Cause``).
FORWARD_CAUSES = tuple(
    c.value for c in (Cause.FORWARD_OVERFLOW, Cause.FORWARD_UNDERFLOW, Cause.FORWARD)
)


@dataclass(frozen=True)
class Rules:
    """The verdict rules; their text is printed at the top of the claims report."""

    avoid_budget_factor: float = 3.0
    delay_factor: float = DELAY_FACTOR
    worse_mae_margin: float = 0.10
    #: "after about N epochs" holds when the measured median is within this factor of N.
    timing_factor: float = 1.5

    def text(self, where: str = "", mechanism: str = "") -> str:
        """The rules in words; ``where`` and ``mechanism`` are the ids of the claims those
        two rules judge (``claims.table.by_role``), named beside them when given."""
        where, mechanism = (f" ({i})" if i else "" for i in (where, mechanism))
        return (
            f"- **NaN only**: every rule reads the runs' first failures (a non-finite value, or "
            f"attention weights not summing to 1, or a masked non-finite gradient) and their "
            f"final MAEs. A run whose validation MAE diverged without a failure (the case "
            f"report's *diverged* column, `diverged_epoch`) is a warning, not a NaN: here it "
            f"counts as a run that stayed finite, with the final MAE it ended at.\n"
            f"- **hits a NaN**: every run (seed) of the setting hits a NaN within its budget.\n"
            f"- **avoids**: no run hits a NaN, and the budget is at least "
            f"{self.avoid_budget_factor:g} times `raw_e`'s median first-NaN epoch in the same "
            f"case; with a shorter budget the claim is *not run*.\n"
            f"- **does not avoid**: at least one run hits a NaN within the budget.\n"
            f"- **delays**: the median first-NaN epoch is at least {self.delay_factor:g} times "
            f"the reference's. A run without a NaN counts as later than its budget; if that "
            f"leaves the median undecided (budget too short) the claim is *not run*. The same "
            f"test is made per optimizer step (a larger batch means fewer steps per epoch), and "
            f"both are reported; the verdict follows the epoch count, the seed's unit. A "
            f"failing variant whose median first-NaN epoch is below the reference's is called "
            f"*earlier*, never delayed.\n"
            f"- **about N epochs**: the median first-NaN epoch is within a factor of "
            f"{self.timing_factor:g} of N (between N/{self.timing_factor:g} and "
            f"N x {self.timing_factor:g}).\n"
            f"- **worse MAE**: the median final MAE is at least "
            f"{self.worse_mae_margin:.0%} higher than that of the best variant that avoids "
            f"the NaN (lowest median final MAE among the avoiders).\n"
            f"- **where**{where}: the first non-finite value of every failing `raw_e` run is in "
            f"the forward stage, at an op of the attention softmax (`softmax_exp` or "
            f"`softmax_div`), and its failure cause is a forward one, not a gradient "
            f'explosion, a loss or an optimizer failure (docs/findings.md, "Reading the '
            f'failure cause").\n'
            f"- **mechanism**{mechanism}: read off the failure cause: every failing `raw_e` run a "
            f"`forward overflow` (an `exp` returned inf) or every one a `forward underflow "
            f"(0/0)` (every `exp` into a node flushed to 0 and the division computed 0/0). Rows "
            f"older than the cause column are read by their op: the softmax's `exp` is an "
            f"overflow, its division (with `exp` finite) an underflow."
        )


# --- the tests the rules make ----------------------------------------------------------------


def hits(stats: Stats) -> bool:
    return stats.nans == stats.runs


def avoids(stats: Stats, reference: Stats, rules: Rules) -> bool | None:
    """True/False, or None when the budget is too short (or the reference never failed)."""
    if stats.nans:
        return False
    if (
        not reference.nans
        or stats.budget_epochs < rules.avoid_budget_factor * reference.median_epoch
    ):
        return None
    return True


def delays(stats: Stats, reference: Stats, rules: Rules, unit: str = "epoch") -> bool | None:
    """Is the first NaN at least ``delay_factor`` times as late as the reference's?"""
    values, base, budget = (
        (stats.epochs, reference.median_epoch, stats.budget_epochs)
        if unit == "epoch"
        else (stats.steps, reference.median_step, stats.budget_steps)
    )
    if not math.isfinite(base):
        return None
    median = float(np.median(values))
    if math.isinf(median):  # most runs outlived the budget: later than the budget
        return True if delays_rule(budget, base, rules.delay_factor) else None
    return delays_rule(median, base, rules.delay_factor)


def worse_mae(stats: Stats, best: float, rules: Rules) -> bool | None:
    if not (math.isfinite(stats.final_mae) and math.isfinite(best)):
        return None
    return stats.final_mae >= (1.0 + rules.worse_mae_margin) * best


def best_avoider(
    stats: dict[str, Stats | None], raw: Stats, rules: Rules
) -> tuple[str | None, Stats | None]:
    """(variant, Stats) of the avoider with the lowest median final MAE, or (None, None)."""
    avoiders = {v: s for v, s in stats.items() if s and avoids(s, raw, rules)}
    return min(avoiders.items(), key=lambda kv: _nan_last(kv[1].final_mae), default=(None, None))


def _nan_last(value: float) -> float:
    return value if math.isfinite(value) else math.inf


def timing_phrase(s: Stats, reference: Stats, rules: Rules, name: str = "raw_e") -> str:
    """How a setting's first NaN compares with the reference's, in words the rule allows."""
    if not s.nans:
        theirs = _number(reference.median_epoch)
        return f"no NaN in {s.budget_epochs} epochs ({name}: median epoch {theirs})"
    mine, theirs = float(np.median(s.epochs)), reference.median_epoch
    if math.isinf(mine):
        return f"most runs stayed finite for {s.budget_epochs} epochs ({name}: {_number(theirs)})"
    pair = f"median epoch {_number(mine)} vs {name}'s {_number(theirs)}"
    if delays(s, reference, rules, "epoch"):
        return f"delayed ({pair})"
    if mine < theirs:
        return f"earlier ({pair})"
    if mine > theirs:
        return f"later, but by less than the rule's factor of {rules.delay_factor:g} ({pair})"
    return f"at the same epoch ({pair})"


def mechanism(raw: Stats) -> str | None:
    """ "overflow", "underflow" or None (another cause, or a mix), by the *mechanism* rule:
    read off the failing runs' causes (``core.failures.read_cause``, which reads a row older
    than the cause column by its op)."""
    if raw.causes == (Cause.FORWARD_OVERFLOW.value,):
        return "overflow"
    if raw.causes == (Cause.FORWARD_UNDERFLOW.value,):
        return "underflow"
    return None


#: What ``mechanism`` found, in the summary's words.
MECHANISM_WORDS = {
    "overflow": "exp overflowed to inf",
    "underflow": "every exp into a node flushed to 0 and the division computed 0/0",
    None: "the mechanism is neither the softmax's exp nor its division",
}


def _softmax_ops(raw: Stats) -> bool:
    return bool(raw.ops) and all("softmax_exp" in op or "softmax_div" in op for op in raw.ops)


# --- one rule function per kind of claim -----------------------------------------------------


@dataclass(frozen=True)
class Outcome:
    """What a rule found: ``holds`` is None when the claim cannot be judged (*not run*)."""

    holds: bool | None
    numbers: str
    why: str = ""


#: A rule: (the variant its claim is about, the reading of its case, the rules) -> Outcome.
Rule = Callable[[str, SeedReading | SweepReading, Rules], Outcome]


def hits_nan(variant: str, reading: SeedReading, rules: Rules) -> Outcome:
    """Every run of ``variant`` hits a NaN (*hits a NaN*)."""
    s = reading.stats[variant]
    why = ""
    if not hits(s):
        why = (
            f"{s.runs - s.nans} of {s.runs} {variant} runs stayed finite for "
            f"{s.budget_epochs} epochs; their max abs attention logit was {s.max_logit:.1f}."
        )
    return Outcome(hits(s), s.describe(), why)


def about_stated_epochs(variant: str, reading: SeedReading, rules: Rules) -> Outcome:
    """The median first-NaN epoch is about ``STATED_EPOCHS`` (*about N epochs*)."""
    s = reading.stats[variant]
    if not s.nans:
        return Outcome(None, s.describe(), f"{variant} never hit a NaN.")
    measured = float(np.median(s.epochs))
    if math.isinf(measured):
        return Outcome(None, s.describe(), f"most {variant} runs stayed finite.")
    ratio = measured / STATED_EPOCHS
    holds = 1 / rules.timing_factor <= ratio <= rules.timing_factor
    numbers = (
        f"stated: about {STATED_EPOCHS} epochs; measured: median first-NaN epoch "
        f"{_number(measured)}, {ratio:.2f} x the stated"
    )
    why = ""
    if not holds:
        side = "later" if ratio > 1 else "earlier"
        why = (
            f"{variant}'s first NaN came {ratio:.2f} x the stated epochs, {side} than the "
            f"rule's factor of {rules.timing_factor:g} allows."
        )
    return Outcome(holds, numbers, why)


def _hit_a_nan(variant: str, s: Stats, raw: Stats, rules: Rules) -> str:
    return (
        f"{variant} hit a NaN in {s.nans}/{s.runs} runs, {timing_phrase(s, raw, rules)}; "
        f"its max abs logit reached {s.max_logit:.1f}."
    )


def avoids_nan(variant: str, reading: SeedReading, rules: Rules) -> Outcome:
    """``variant`` avoids the NaN that ``raw_e`` hits (*avoids*)."""
    s, raw = reading.stats[variant], reading.raw
    holds = avoids(s, raw, rules)
    why = ""
    if holds is False:
        why = _hit_a_nan(variant, s, raw, rules)
    elif holds is None:
        why = (
            f"The budget of {s.budget_epochs} epochs is under {rules.avoid_budget_factor:g} x "
            f"raw_e's median first-NaN epoch ({_number(raw.median_epoch)})."
        )
    return Outcome(holds, s.describe(), why)


def does_not_avoid(variant: str, reading: SeedReading, rules: Rules) -> Outcome:
    """``variant`` still hits a NaN in some run (*does not avoid*)."""
    s, raw = reading.stats[variant], reading.raw
    holds = s.nans > 0
    numbers = s.describe()
    if holds:
        numbers += f"; vs raw_e: {timing_phrase(s, raw, rules)}"
    why = (
        ""
        if holds
        else (
            f"{variant} stayed finite in all {s.runs} runs for {s.budget_epochs} epochs "
            f"(raw_e: first NaN at epoch {_number(raw.median_epoch)}); "
            f"max abs logit {s.max_logit:.1f}."
        )
    )
    return Outcome(holds, numbers, why)


def avoids_with_worse_mae(variant: str, reading: SeedReading, rules: Rules) -> Outcome:
    """``variant`` avoids the NaN, at a *worse MAE* than the best avoider's."""
    return _avoids_at_a_cost(variant, reading, rules, worse=True)


def avoids_without_worse_mae(variant: str, reading: SeedReading, rules: Rules) -> Outcome:
    """``variant`` avoids the NaN, at no *worse MAE* than the best avoider's."""
    return _avoids_at_a_cost(variant, reading, rules, worse=False)


def _avoids_at_a_cost(variant: str, reading: SeedReading, rules: Rules, worse: bool) -> Outcome:
    s, raw = reading.stats[variant], reading.raw
    best_name, best_stats = best_avoider(reading.stats, raw, rules)
    avoid = avoids(s, raw, rules)
    cost = worse_mae(s, best_stats.final_mae, rules) if best_stats else None
    numbers = s.describe()
    if best_stats is not None:
        numbers += f"; best avoider {best_name}: final MAE {_number(best_stats.final_mae)}"
        if math.isfinite(s.final_mae) and best_stats.final_mae:
            numbers += f" (x{s.final_mae / best_stats.final_mae:.2f})"
    if avoid is False:  # hitting a NaN fails the claim, whatever the MAE
        return Outcome(False, numbers, _hit_a_nan(variant, s, raw, rules))
    if avoid is None or cost is None:
        return Outcome(None, numbers, "The avoid or MAE test could not be made.")
    why = ""
    if cost != worse:
        change = s.final_mae / best_stats.final_mae - 1.0
        why = (
            f"{variant}'s median final MAE is {change:+.0%} against {best_name}'s "
            f"({_number(s.final_mae)} vs {_number(best_stats.final_mae)})."
        )
    return Outcome(cost if worse else not cost, numbers, why)


def in_forward_softmax(variant: str, reading: SeedReading, rules: Rules) -> Outcome:
    """The first non-finite value is in the forward softmax, by a forward cause (*where*)."""
    s = reading.stats[variant]
    if not s.nans:
        return Outcome(None, s.describe(), f"{variant} never hit a NaN.")
    numbers = f"stage: {', '.join(s.wheres)}; op: {', '.join(s.ops) or '-'}"
    if s.causes:
        numbers += f"; cause: {', '.join(s.causes)}"
    forward_causes = all(c in FORWARD_CAUSES for c in s.causes)
    holds = s.wheres == ("forward",) and _softmax_ops(s) and forward_causes
    why = ""
    if not holds:
        cause = f" (cause: {', '.join(s.causes)})" if s.causes else ""
        why = (
            f"The first non-finite value came from {', '.join(s.ops) or 'no named op'} in "
            f"the {', '.join(s.wheres)} stage{cause}, not from the forward softmax."
        )
    return Outcome(holds, numbers, why)


def exp_overflow(variant: str, reading: SeedReading, rules: Rules) -> Outcome:
    """The failure is the softmax's ``exp`` overflowing (*mechanism*)."""
    s = reading.stats[variant]
    if not s.nans:
        return Outcome(None, s.describe(), f"{variant} never hit a NaN.")
    limits = exp_limits(s.dtype)
    cause = f"cause: {', '.join(s.causes)}; " if s.causes else ""
    numbers = (
        f"{cause}op: {', '.join(s.ops) or '-'}; max abs logit {s.max_logit:.1f}; {s.dtype} "
        f"exp overflows above +{limits.overflow:.2f} and a node's whole segment flushes to 0 "
        f"below -{limits.underflow:.2f}"
    )
    found = mechanism(s)
    why = ""
    if found == "underflow":
        why = (
            f"The softmax's division came first, its exp finite: 0/0 after every exp into a "
            f"node flushed to 0, with {variant}'s max abs logit at {s.max_logit:.1f}, "
            f"{'above' if s.max_logit > limits.overflow else 'below'} the overflow line."
        )
    elif found is None:
        cause = f" (cause: {', '.join(s.causes)})" if s.causes else ""
        why = (
            f"The first non-finite value came from {', '.join(s.ops) or 'no named op'} in "
            f"the {', '.join(s.wheres)} stage{cause}, not from the softmax's exp."
        )
    return Outcome(found == "overflow", numbers, why)


def delays_across(variant: str, reading: SweepReading, rules: Rules) -> Outcome:
    """Each later value of the sweep delays the NaN against the first (*delays*, per epoch;
    per step too where the steps per epoch change)."""
    per_epoch = [delays(s, reading.base, rules, "epoch") for _, s in reading.others]
    holds = None if None in per_epoch else all(per_epoch)
    numbers = reading.numbers
    if reading.per_step:
        per_step = [delays(s, reading.base, rules, "step") for _, s in reading.others]
        numbers += f". Delayed per epoch: {_all_yes(per_epoch)}; per step: {_all_yes(per_step)}."
    why = ""
    if holds is False:
        unit = " in epochs" if reading.per_step else ""
        why = f"{reading.change} did not delay the first NaN by the rule's factor{unit}."
    return Outcome(holds, numbers, why)


def still_fails_across(variant: str, reading: SweepReading, rules: Rules) -> Outcome:
    """At no later value of the sweep does ``variant`` avoid the NaN (*does not avoid*: a
    value where it avoids fails the claim)."""
    avoided = [(value, avoids(s, reading.base, rules)) for value, s in reading.others]
    outcomes = [a for _, a in avoided]
    if True in outcomes:
        names = ", ".join(f"{reading.unit} {v:g}" for v, a in avoided if a)
        why = f"{variant} avoided the NaN for the whole budget at {names}."
        return Outcome(False, reading.numbers, why)
    if None in outcomes:
        names = ", ".join(f"{reading.unit} {v:g}" for v, a in avoided if a is None)
        why = f"At {names} no run hit a NaN, but the budget is too short to call it avoided."
        return Outcome(None, reading.numbers, why)
    return Outcome(True, reading.numbers)


def _all_yes(values: list[bool | None]) -> str:
    return "undecided" if None in values else ("yes" if all(values) else "no")
