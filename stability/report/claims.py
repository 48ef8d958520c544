"""The seed's claims C1-C11, judged from result rows by written rules.

Nothing here knows an expected answer: each verdict is computed from the rows of the claim
cases (``cases/seed.toml``, ``cases/batch_size.toml``, ``cases/learning_rate.toml``) by the
rules in ``Rules``, and comes with the numbers it was computed from.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pandas as pd

from stability.core.limits import exp_limits
from stability.report.summary import Setting

REPRODUCED, NOT_REPRODUCED, NOT_RUN = "reproduced", "not reproduced", "not run"

#: The seed's "after about 30 epochs" (C1b).
STATED_EPOCHS = 30


@dataclass(frozen=True)
class Rules:
    """The verdict rules; their text is printed at the top of the claims report."""

    avoid_budget_factor: float = 3.0
    delay_factor: float = 1.5
    worse_mae_margin: float = 0.10
    #: "after about N epochs" holds when the measured median is within this factor of N.
    timing_factor: float = 1.5

    def text(self) -> str:
        return (
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
            f"- **where** (C11a): the first non-finite value of every failing `raw_e` run is in "
            f"the forward stage, at an op of the attention softmax (`softmax_exp` or "
            f"`softmax_div`), and its failure cause is a forward one, not a gradient "
            f'explosion, a loss or an optimizer failure (docs/findings.md, "Reading the '
            f'failure cause").\n'
            f"- **mechanism** (C11b): read off the failure cause: every failing `raw_e` run a "
            f"`forward overflow` (an `exp` returned inf) or every one a `forward underflow "
            f"(0/0)` (every `exp` into a node flushed to 0 and the division computed 0/0). Rows "
            f"older than the cause column are read by their op: the softmax's `exp` is an "
            f"overflow, its division (with `exp` finite) an underflow."
        )


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
    #: The failing runs' ``failure_cause`` values (empty for rows older than the column).
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
            low, high = _number(hit.min()), _number(hit.max())
            nan += f", first at epoch {_number(np.median(hit))} [{low}-{high}]"
        return (
            f"{nan} (budget {self.budget_epochs} epochs); max abs logit {self.max_logit:.1f}; "
            f"final MAE {_number(self.final_mae)}"
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
        return True if budget >= rules.delay_factor * base else None
    return median >= rules.delay_factor * base


def worse_mae(stats: Stats, best: float, rules: Rules) -> bool | None:
    if not (math.isfinite(stats.final_mae) and math.isfinite(best)):
        return None
    return stats.final_mae >= (1.0 + rules.worse_mae_margin) * best


def _number(value: float) -> str:
    """A number to 4 significant digits, '-' for a missing or infinite one."""
    return "-" if value is None or not math.isfinite(value) else f"{value:.4g}"


@dataclass(frozen=True)
class Verdict:
    id: str
    claim: str
    verdict: str
    numbers: str
    why: str
    report: str


#: id -> the seed's words, verbatim (``[...]`` marks a cut; ``"; "`` joins two quotes).
#: ``tests/test_claims.py`` checks every quoted piece against the seed's text.
CLAIMS = {
    "C1a": '"the training loss suddenly jumps to NaN after about 30 epochs with a batch size of '
    '32"',
    "C1b": '"after about 30 epochs"',
    "C2a": '"If the batch size is 128, still the gradients explode after about 200 epochs"; '
    '"Tried larger batch sizes (till 256, although delayed gradient explosion happens at some '
    'point)"',
    "C2b": '"still the gradients explode"; "although delayed gradient explosion happens at some '
    'point"',
    "C3": '"If I didn\u2019t concatenate neighbors_mean with e [...] there would be no gradient '
    'explosion."',
    "C4": '"I can avoid gradient explosion by sending e through a sigmoid function [...] But this '
    'degrades the performance (final MAE)"',
    "C5": '"Note that Rectified Linear Unit (ReLU) instead of sigmoid didn\u2019t work."',
    "C6": '"Applied gradient clipping \u2013 with Adam(lr, clipnorm=1, clipvalue=5) and also with '
    'tf.clip_by_global_norm(gradients, 1.0)"; "which is why it couldn\u2019t be solved with '
    'gradient clipping"',
    "C7": "\"tried limiting 'sigma' with  sigma = tf.clip_by_value(sigma,-4,1.0) but the "
    'gradients still explode"',
    "C8a": '"Tried with reduced learning rate"',
    "C8b": '"I basically tried everything suggested online to avoid gradient explosion."; '
    '"Tried with reduced learning rate"',
    "C9": '"I applied kernel constraints [...] This resolved the problem without degrading the '
    'performance."',
    "C10": '"Alternatively, one could use the numerically stable implementation of the softmax '
    'function."',
    "C11a": '"this is technically not a gradient exploding problem"',
    "C11b": '"softmax calculates an exponential [...] This was producing inf values and '
    'eventually everything becoming nan"',
}

#: What the harness tests for each claim: its reading, kept outside the seed's quotes.
TESTS = {
    "C1a": "every raw_e run at batch 32 hits a NaN",
    "C1b": "raw_e's median first-NaN epoch is about the stated 30",
    "C2a": "raw_e at each larger batch delays the NaN (per epoch)",
    "C2b": "raw_e at each larger batch does not avoid the NaN",
    "C3": "no_e avoids the NaN",
    "C4": "sigmoid_e avoids the NaN, with a worse MAE",
    "C5": "relu_e does not avoid the NaN",
    "C6": "grad_clip does not avoid the NaN",
    "C7": "sigma_clip does not avoid the NaN",
    "C8a": "raw_e at each lower learning rate delays the NaN (per epoch)",
    "C8b": "raw_e at each lower learning rate does not avoid the NaN",
    "C9": "weight_constrained avoids the NaN, with no worse MAE",
    "C10": "stable_softmax avoids the NaN",
    "C11a": "where: raw_e's first non-finite value is in the forward softmax",
    "C11b": "mechanism: it is an exp overflow",
}


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

    def seed_stats(self, variant: str) -> Stats | None:
        if self.seed is None:
            return None
        return setting_stats(
            self.seed,
            variant,
            self.steps_per_epoch(self.seed_batch_size),
            self.seed_batch_size,
            self.seed_learning_rate,
        )


def judge(inputs: ClaimInputs, rules: Rules | None = None) -> list[Verdict]:
    """One ``Verdict`` per claim, in the order of ``CLAIMS``."""
    rules = rules or Rules()
    verdicts = {v.id: v for v in _seed_claims(inputs, rules)}
    verdicts.update({v.id: v for v in _batch_claims(inputs, rules)})
    verdicts.update({v.id: v for v in _learning_rate_claims(inputs, rules)})
    return [verdicts[claim] for claim in CLAIMS]


def _not_run(claim: str, report: str, why: str) -> Verdict:
    return Verdict(claim, CLAIMS[claim], NOT_RUN, "-", why, report)


def _verdict(claim: str, holds: bool | None, numbers: str, why: str, report: str) -> Verdict:
    verdict = NOT_RUN if holds is None else (REPRODUCED if holds else NOT_REPRODUCED)
    return Verdict(claim, CLAIMS[claim], verdict, numbers, why, report)


SEED_CLAIMS = ("C1a", "C1b", "C3", "C4", "C5", "C6", "C7", "C9", "C10", "C11a", "C11b")


def _seed_claims(inputs: ClaimInputs, rules: Rules) -> list[Verdict]:
    report = "[seed](seed.md)"
    raw = inputs.seed_stats("raw_e")
    if raw is None:
        return [_not_run(c, report, "cases/seed.toml has no raw_e rows") for c in SEED_CLAIMS]
    stats = {v: inputs.seed_stats(v) for v in inputs.seed["variant"].unique()}
    best = best_avoider(stats, raw, rules)
    out = [_verdict("C1a", hits(raw), raw.describe(), _hit_why("raw_e", raw), report)]
    out.append(_timing_claim(raw, rules, report))
    out.append(_avoid_claim("C3", "no_e", stats, raw, rules, report))
    out.append(_mae_claim("C4", "sigmoid_e", stats, raw, best, rules, report, worse=True))
    for claim, variant in (("C5", "relu_e"), ("C6", "grad_clip"), ("C7", "sigma_clip")):
        out.append(_fail_claim(claim, variant, stats, raw, rules, report))
    out.append(_mae_claim("C9", "weight_constrained", stats, raw, best, rules, report, worse=False))
    out.append(_avoid_claim("C10", "stable_softmax", stats, raw, rules, report))
    out += [_where_claim(raw, report), _mechanism_claim(raw, report)]
    return out


def best_avoider(
    stats: dict[str, Stats | None], raw: Stats, rules: Rules
) -> tuple[str | None, Stats | None]:
    """(variant, Stats) of the avoider with the lowest median final MAE, or (None, None)."""
    avoiders = {v: s for v, s in stats.items() if s and avoids(s, raw, rules)}
    return min(avoiders.items(), key=lambda kv: _nan_last(kv[1].final_mae), default=(None, None))


def _nan_last(value: float) -> float:
    return value if math.isfinite(value) else math.inf


def _hit_why(variant: str, stats: Stats) -> str:
    if hits(stats):
        return ""
    return (
        f"{stats.runs - stats.nans} of {stats.runs} {variant} runs stayed finite for "
        f"{stats.budget_epochs} epochs; their max abs attention logit was {stats.max_logit:.1f}."
    )


def _timing_claim(raw: Stats, rules: Rules, report: str) -> Verdict:
    if not raw.nans:
        return _verdict("C1b", None, raw.describe(), "raw_e never hit a NaN.", report)
    measured = float(np.median(raw.epochs))
    if math.isinf(measured):
        return _verdict("C1b", None, raw.describe(), "most raw_e runs stayed finite.", report)
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
            f"raw_e's first NaN came {ratio:.2f} x the stated epochs, {side} than the rule's "
            f"factor of {rules.timing_factor:g} allows."
        )
    return _verdict("C1b", holds, numbers, why, report)


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


def _avoid_claim(claim, variant, stats, raw, rules, report) -> Verdict:
    s = stats.get(variant)
    if s is None:
        return _not_run(claim, report, f"no {variant} rows")
    holds = avoids(s, raw, rules)
    why = ""
    if holds is False:
        why = (
            f"{variant} hit a NaN in {s.nans}/{s.runs} runs, {timing_phrase(s, raw, rules)}; "
            f"its max abs logit reached {s.max_logit:.1f}."
        )
    elif holds is None:
        why = (
            f"The budget of {s.budget_epochs} epochs is under {rules.avoid_budget_factor:g} x "
            f"raw_e's median first-NaN epoch ({_number(raw.median_epoch)})."
        )
    return _verdict(claim, holds, s.describe(), why, report)


def _fail_claim(claim, variant, stats, raw, rules, report) -> Verdict:
    s = stats.get(variant)
    if s is None:
        return _not_run(claim, report, f"no {variant} rows")
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
    return _verdict(claim, holds, numbers, why, report)


def _mae_claim(claim, variant, stats, raw, best, rules, report, worse: bool) -> Verdict:
    s = stats.get(variant)
    if s is None:
        return _not_run(claim, report, f"no {variant} rows")
    best_name, best_stats = best
    avoid = avoids(s, raw, rules)
    cost = worse_mae(s, best_stats.final_mae, rules) if best_stats else None
    numbers = s.describe()
    if best_stats is not None:
        numbers += f"; best avoider {best_name}: final MAE {_number(best_stats.final_mae)}"
        if math.isfinite(s.final_mae) and best_stats.final_mae:
            numbers += f" (x{s.final_mae / best_stats.final_mae:.2f})"
    if avoid is False:  # hitting a NaN fails the claim, whatever the MAE
        why = (
            f"{variant} hit a NaN in {s.nans}/{s.runs} runs, {timing_phrase(s, raw, rules)}; "
            f"its max abs logit reached {s.max_logit:.1f}."
        )
        return _verdict(claim, False, numbers, why, report)
    if avoid is None or cost is None:
        return _verdict(claim, None, numbers, "The avoid or MAE test could not be made.", report)
    holds = cost if worse else not cost
    why = ""
    if cost != worse:
        change = s.final_mae / best_stats.final_mae - 1.0
        why = (
            f"{variant}'s median final MAE is {change:+.0%} against {best_name}'s "
            f"({_number(s.final_mae)} vs {_number(best_stats.final_mae)})."
        )
    return _verdict(claim, holds, numbers, why, report)


def _softmax_ops(raw: Stats) -> bool:
    return bool(raw.ops) and all("softmax_exp" in op or "softmax_div" in op for op in raw.ops)


#: The failure causes of a forward failure (``stability.train.cause``).
FORWARD_CAUSES = ("forward overflow", "forward underflow (0/0)", "forward")


def _where_claim(raw: Stats, report: str) -> Verdict:
    if not raw.nans:
        return _verdict("C11a", None, raw.describe(), "raw_e never hit a NaN.", report)
    numbers = f"stage: {', '.join(raw.wheres)}; op: {', '.join(raw.ops) or '-'}"
    if raw.causes:
        numbers += f"; cause: {', '.join(raw.causes)}"
    forward_causes = all(c in FORWARD_CAUSES for c in raw.causes)
    holds = raw.wheres == ("forward",) and _softmax_ops(raw) and forward_causes
    why = ""
    if not holds:
        cause = f" (cause: {', '.join(raw.causes)})" if raw.causes else ""
        why = (
            f"The first non-finite value came from {', '.join(raw.ops) or 'no named op'} in "
            f"the {', '.join(raw.wheres)} stage{cause}, not from the forward softmax."
        )
    return _verdict("C11a", holds, numbers, why, report)


def mechanism(raw: Stats) -> str | None:
    """ "overflow", "underflow" or None (another cause, or a mix), by the C11b rule."""
    if raw.causes:
        if raw.causes == ("forward overflow",):
            return "overflow"
        if raw.causes == ("forward underflow (0/0)",):
            return "underflow"
        return None
    if not raw.ops or raw.wheres != ("forward",):
        return None
    if all("softmax_exp" in op for op in raw.ops):
        return "overflow"
    if all("softmax_div" in op for op in raw.ops):
        return "underflow"
    return None


def _mechanism_claim(raw: Stats, report: str) -> Verdict:
    if not raw.nans:
        return _verdict("C11b", None, raw.describe(), "raw_e never hit a NaN.", report)
    limits = exp_limits(raw.dtype)
    cause = f"cause: {', '.join(raw.causes)}; " if raw.causes else ""
    numbers = (
        f"{cause}op: {', '.join(raw.ops) or '-'}; max abs logit {raw.max_logit:.1f}; {raw.dtype} "
        f"exp overflows above +{limits.overflow:.2f} and a node's whole segment flushes to 0 "
        f"below -{limits.underflow:.2f}"
    )
    found = mechanism(raw)
    why = ""
    if found == "underflow":
        why = (
            f"The softmax's division came first, its exp finite: 0/0 after every exp into a "
            f"node flushed to 0, with raw_e's max abs logit at {raw.max_logit:.1f}, "
            f"{'above' if raw.max_logit > limits.overflow else 'below'} the overflow line."
        )
    elif found is None:
        cause = f" (cause: {', '.join(raw.causes)})" if raw.causes else ""
        why = (
            f"The first non-finite value came from {', '.join(raw.ops) or 'no named op'} in "
            f"the {', '.join(raw.wheres)} stage{cause}, not from the softmax's exp."
        )
    return _verdict("C11b", found == "overflow", numbers, why, report)


def _batch_claims(inputs: ClaimInputs, rules: Rules) -> list[Verdict]:
    report = "[batch_size](batch_size.md)"
    frame = inputs.batch_size
    if frame is None:
        return [_not_run(c, report, "cases/batch_size.toml was not run") for c in ("C2a", "C2b")]
    sizes = sorted(frame["batch_size"].unique())
    base = setting_stats(frame, "raw_e", inputs.steps_per_epoch(sizes[0]), sizes[0])
    parts, per_epoch, per_step, avoided = [f"batch {sizes[0]}: {base.describe()}"], [], [], []
    for size in sizes[1:]:
        s = setting_stats(frame, "raw_e", inputs.steps_per_epoch(size), size)
        per_epoch.append(delays(s, base, rules, "epoch"))
        per_step.append(delays(s, base, rules, "step"))
        avoided.append((size, avoids(s, base, rules)))
        parts.append(
            f"batch {size}: {s.describe()}; median first-NaN step "
            f"{_number(s.median_step)} vs {_number(base.median_step)}"
        )
    numbers = "; ".join(parts)
    delayed = None if None in per_epoch else all(per_epoch)
    steps = _all_yes(per_step)
    delay_numbers = numbers + f". Delayed per epoch: {_all_yes(per_epoch)}; per step: {steps}."
    delay_why = (
        "A larger batch did not delay the first NaN by the rule's factor in epochs."
        if delayed is False
        else ""
    )
    return [
        _verdict("C2a", delayed, delay_numbers, delay_why, report),
        _not_avoided("C2b", avoided, "batch", numbers, report),
    ]


def _not_avoided(claim, avoided, unit, numbers, report) -> Verdict:
    """Each setting in ``avoided`` ((value, avoids verdict)) still fails: the claim holds."""
    outcomes = [a for _, a in avoided]
    if True in outcomes:
        names = ", ".join(f"{unit} {v:g}" for v, a in avoided if a)
        return _verdict(
            claim, False, numbers, f"raw_e avoided the NaN for the whole budget at {names}.", report
        )
    if None in outcomes:
        names = ", ".join(f"{unit} {v:g}" for v, a in avoided if a is None)
        why = f"At {names} no run hit a NaN, but the budget is too short to call it avoided."
        return _verdict(claim, None, numbers, why, report)
    return _verdict(claim, True, numbers, "", report)


def _learning_rate_claims(inputs: ClaimInputs, rules: Rules) -> list[Verdict]:
    report = "[learning_rate](learning_rate.md)"
    frame = inputs.learning_rate
    if frame is None:
        return [_not_run(c, report, "cases/learning_rate.toml was not run") for c in ("C8a", "C8b")]
    rates = sorted(frame["learning_rate"].unique(), reverse=True)
    batch = int(frame["batch_size"].iloc[0])
    per_epoch = inputs.steps_per_epoch(batch)
    base = setting_stats(frame, "raw_e", per_epoch, learning_rate=rates[0])
    parts, delayed, avoided = [f"lr {rates[0]:g}: {base.describe()}"], [], []
    for rate in rates[1:]:
        s = setting_stats(frame, "raw_e", per_epoch, learning_rate=rate)
        delayed.append(delays(s, base, rules, "epoch"))
        avoided.append((rate, avoids(s, base, rules)))
        parts.append(f"lr {rate:g}: {s.describe()}")
    numbers = "; ".join(parts)
    holds = None if None in delayed else all(delayed)
    why = (
        "A lower learning rate did not delay the first NaN by the rule's factor."
        if (holds is False)
        else ""
    )
    return [
        _verdict("C8a", holds, numbers, why, report),
        _not_avoided("C8b", avoided, "lr", numbers, report),
    ]


def _all_yes(values: list[bool | None]) -> str:
    return "undecided" if None in values else ("yes" if all(values) else "no")
