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
from stability.report.summary import Setting, settings

REPRODUCED, NOT_REPRODUCED, NOT_RUN = "reproduced", "not reproduced", "not run"


@dataclass(frozen=True)
class Rules:
    """The verdict rules; their text is printed at the top of the claims report."""

    avoid_budget_factor: float = 3.0
    delay_factor: float = 1.5
    worse_mae_margin: float = 0.10

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
            f"both are reported; the verdict follows the epoch count, the seed's unit.\n"
            f"- **worse MAE**: the median final MAE is at least "
            f"{self.worse_mae_margin:.0%} higher than that of the best variant that avoids "
            f"the NaN (lowest median final MAE among the avoiders)."
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


#: id -> the seed's words.
CLAIMS = {
    "C1": '"the training loss suddenly jumps to NaN after about 30 epochs with a batch size of 32"',
    "C2": '"If the batch size is 128, still the gradients explode after about 200 epochs"; '
    '"Tried larger batch sizes (till 256, although delayed gradient explosion happens at some '
    'point)"',
    "C3": "\"If I didn't concatenate neighbors_mean with e [...] there would be no gradient "
    'explosion."',
    "C4": '"I can avoid gradient explosion by sending e through a sigmoid function [...] But this '
    'degrades the performance (final MAE)"',
    "C5": '"Note that Rectified Linear Unit (ReLU) instead of sigmoid didn\'t work."',
    "C6": '"Applied gradient clipping - with Adam(lr, clipnorm=1, clipvalue=5) and also with '
    'tf.clip_by_global_norm(gradients, 1.0)" (it did not help)',
    "C7": "\"tried limiting 'sigma' with sigma = tf.clip_by_value(sigma,-4,1.0) but the gradients "
    'still explode"',
    "C8": '"Tried with reduced learning rate" (among what did not fix it: it delays the NaN)',
    "C9": '"I applied kernel constraints [...] This resolved the problem without degrading the '
    'performance."',
    "C10": '"Alternatively, one could use the numerically stable implementation of the softmax '
    'function."',
    "C11": '"softmax calculates an exponential [...] This was producing inf values and eventually '
    'everything becoming nan [...] this is technically not a gradient exploding problem"',
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


def judge(inputs: ClaimInputs, rules: Rules | None = None) -> list[Verdict]:
    """One ``Verdict`` per claim, C1 to C11."""
    rules = rules or Rules()
    verdicts = _seed_claims(inputs, rules)
    verdicts.insert(1, _batch_claim(inputs, rules))
    verdicts.insert(7, _learning_rate_claim(inputs, rules))
    return verdicts


def _seed_stats(inputs: ClaimInputs, variant: str) -> Stats | None:
    if inputs.seed is None:
        return None
    return setting_stats(
        inputs.seed,
        variant,
        inputs.steps_per_epoch(inputs.seed_batch_size),
        inputs.seed_batch_size,
        inputs.seed_learning_rate,
    )


def _not_run(claim: str, report: str, why: str) -> Verdict:
    return Verdict(claim, CLAIMS[claim], NOT_RUN, "-", why, report)


def _seed_claims(inputs: ClaimInputs, rules: Rules) -> list[Verdict]:
    report = "[seed](seed.md)"
    raw = _seed_stats(inputs, "raw_e")
    if raw is None:
        return [
            _not_run(c, report, "cases/seed.toml has no raw_e rows")
            for c in ("C1", "C3", "C4", "C5", "C6", "C7", "C9", "C10", "C11")
        ]
    stats = {v: _seed_stats(inputs, v) for v in inputs.seed["variant"].unique()}
    avoiders = {v: s for v, s in stats.items() if s and avoids(s, raw, rules)}
    best = min(avoiders.items(), key=lambda kv: _nan_last(kv[1].final_mae), default=(None, None))
    out = [_verdict("C1", hits(raw), raw.describe(), _hit_why("raw_e", raw), report)]
    out.append(_avoid_claim("C3", "no_e", stats, raw, rules, report))
    out.append(_mae_claim("C4", "sigmoid_e", stats, raw, best, rules, report, worse=True))
    for claim, variant in (("C5", "relu_e"), ("C6", "grad_clip"), ("C7", "sigma_clip")):
        out.append(_fail_claim(claim, variant, stats, raw, report))
    out.append(_mae_claim("C9", "weight_constrained", stats, raw, best, rules, report, worse=False))
    out.append(_avoid_claim("C10", "stable_softmax", stats, raw, rules, report))
    out.append(_exp_claim(raw, report))
    return out


def _nan_last(value: float) -> float:
    return value if math.isfinite(value) else math.inf


def _verdict(claim: str, holds: bool | None, numbers: str, why: str, report: str) -> Verdict:
    verdict = NOT_RUN if holds is None else (REPRODUCED if holds else NOT_REPRODUCED)
    return Verdict(claim, CLAIMS[claim], verdict, numbers, why, report)


def _hit_why(variant: str, stats: Stats) -> str:
    if hits(stats):
        return ""
    return (
        f"{stats.runs - stats.nans} of {stats.runs} {variant} runs stayed finite for "
        f"{stats.budget_epochs} epochs; their max abs attention logit was {stats.max_logit:.1f}."
    )


def _avoid_claim(claim, variant, stats, raw, rules, report) -> Verdict:
    s = stats.get(variant)
    if s is None:
        return _not_run(claim, report, f"no {variant} rows")
    holds = avoids(s, raw, rules)
    why = ""
    if holds is False:
        why = (
            f"{variant} hit a NaN in {s.nans}/{s.runs} runs; its max abs logit reached "
            f"{s.max_logit:.1f}."
        )
    elif holds is None:
        why = (
            f"The budget of {s.budget_epochs} epochs is under {rules.avoid_budget_factor:g} x "
            f"raw_e's median first-NaN epoch ({_number(raw.median_epoch)})."
        )
    return _verdict(claim, holds, s.describe(), why, report)


def _fail_claim(claim, variant, stats, raw, report) -> Verdict:
    s = stats.get(variant)
    if s is None:
        return _not_run(claim, report, f"no {variant} rows")
    holds = s.nans > 0
    why = (
        ""
        if holds
        else (
            f"{variant} stayed finite in all {s.runs} runs for {s.budget_epochs} epochs "
            f"(raw_e: first NaN at epoch {_number(raw.median_epoch)}); "
            f"max abs logit {s.max_logit:.1f}."
        )
    )
    return _verdict(claim, holds, s.describe(), why, report)


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
        first = np.median(s.epochs[np.isfinite(s.epochs)])
        why = (
            f"{variant} hit a NaN in {s.nans}/{s.runs} runs, first at epoch {_number(first)} "
            f"against raw_e's {_number(raw.median_epoch)}: it delayed the NaN, its max abs logit "
            f"reaching {s.max_logit:.1f}."
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


def _exp_claim(raw: Stats, report: str) -> Verdict:
    if not raw.nans:
        return _verdict("C11", None, raw.describe(), "raw_e never hit a NaN.", report)
    numbers = f"stage: {', '.join(raw.wheres)}; op: {', '.join(raw.ops) or '-'}"
    forward_exp = raw.wheres == ("forward",) and all("softmax_exp" in op for op in raw.ops)
    forward_exp = forward_exp and bool(raw.ops)
    why = ""
    if not forward_exp:
        limits = exp_limits("float32")
        why = (
            f"The first non-finite value came from {', '.join(raw.ops) or 'no named op'} in "
            f"the {', '.join(raw.wheres)} stage, with raw_e's max abs logit at "
            f"{raw.max_logit:.1f}: {'above' if raw.max_logit > limits.overflow else 'below'} "
            f"exp's float32 overflow ({limits.overflow:.2f}), "
            f"{'past' if raw.max_logit > limits.underflow else 'short of'} its flush-to-zero "
            f"underflow ({limits.underflow:.2f})."
        )
    return _verdict("C11", forward_exp, numbers, why, report)


def _batch_claim(inputs: ClaimInputs, rules: Rules) -> Verdict:
    report = "[batch_size](batch_size.md)"
    frame = inputs.batch_size
    if frame is None:
        return _not_run("C2", report, "cases/batch_size.toml was not run")
    sizes = sorted(frame["batch_size"].unique())
    base = setting_stats(frame, "raw_e", inputs.steps_per_epoch(sizes[0]), sizes[0])
    parts, per_epoch, per_step = [f"batch {sizes[0]}: {base.describe()}"], [], []
    for size in sizes[1:]:
        s = setting_stats(frame, "raw_e", inputs.steps_per_epoch(size), size)
        per_epoch.append(delays(s, base, rules, "epoch"))
        per_step.append(delays(s, base, rules, "step"))
        parts.append(
            f"batch {size}: {s.describe()}; median first-NaN step "
            f"{_number(s.median_step)} vs {_number(base.median_step)}"
        )
    holds = None if None in per_epoch else all(per_epoch)
    steps = "undecided" if None in per_step else ("yes" if all(per_step) else "no")
    numbers = "; ".join(parts) + f". Delayed per epoch: {_all_yes(per_epoch)}; per step: {steps}."
    why = (
        ""
        if holds
        else "A larger batch did not delay the first NaN by the rule's factor in epochs."
    )
    return _verdict("C2", holds, numbers, why if holds is False else "", report)


def _learning_rate_claim(inputs: ClaimInputs, rules: Rules) -> Verdict:
    report = "[learning_rate](learning_rate.md)"
    frame = inputs.learning_rate
    if frame is None:
        return _not_run("C8", report, "cases/learning_rate.toml was not run")
    rates = sorted(frame["learning_rate"].unique(), reverse=True)
    batch = int(frame["batch_size"].iloc[0])
    per_epoch = inputs.steps_per_epoch(batch)
    base = setting_stats(frame, "raw_e", per_epoch, learning_rate=rates[0])
    parts, results = [f"lr {rates[0]:g}: {base.describe()}"], []
    for rate in rates[1:]:
        s = setting_stats(frame, "raw_e", per_epoch, learning_rate=rate)
        results.append(delays(s, base, rules, "epoch"))
        parts.append(f"lr {rate:g}: {s.describe()}")
    holds = None if None in results else all(results)
    why = (
        ""
        if holds is not False
        else "A lower learning rate did not delay the first NaN by the rule's factor."
    )
    return _verdict("C8", holds, "; ".join(parts), why, report)


def _all_yes(values: list[bool | None]) -> str:
    return "undecided" if None in values else ("yes" if all(values) else "no")


def molecules_section(frame: pd.DataFrame | None) -> str:
    """The same variants on the G2 molecules, where that case was run: one row each."""
    if frame is None:
        return ""
    rows = [
        {
            "variant": variant,
            "NaN in": f"{s.nan_runs}/{s.runs}",
            "max abs logit, median": round(s.median("max_abs_logit"), 1),
            "final MAE, median (kcal/mol)": round(s.final_mae, 2),
        }
        for (variant,), s in sorted(settings(frame, ["variant"]), key=lambda kv: kv[0])
    ]
    return (
        "## The same variants on real molecules\n\n"
        "[g2_molecules](g2_molecules.md): the seed case's model and variants on the 148 G2 "
        "molecules shipped with ASE (target: enthalpy of formation). The claims above are "
        "judged on the synthetic cases only; this table shows whether their failures occur "
        "on real geometries at all.\n\n" + pd.DataFrame(rows).to_markdown(index=False)
    )


def claims_markdown(
    verdicts: list[Verdict], rules: Rules, meaning: str, molecules: str = ""
) -> str:
    """``reports/claims.md``: the rules, one row per claim, and what it means."""
    table = pd.DataFrame(
        [
            {
                "id": v.id,
                "the seed says": v.claim,
                "verdict": v.verdict,
                "numbers": v.numbers,
                "why not": v.why or "",
                "report": v.report,
            }
            for v in verdicts
        ]
    )
    counts = table["verdict"].value_counts()
    summary = ", ".join(f"{counts.get(k, 0)} {k}" for k in (REPRODUCED, NOT_REPRODUCED, NOT_RUN))
    parts = [
        "# The seed's claims, checked",
        "Every verdict below is computed from the rows of the claim cases' CSVs by these rules "
        "(`stability/claims.py`); none is written by hand.",
        "## Rules",
        rules.text(),
        f"## Verdicts ({summary})",
        table.to_markdown(index=False),
        "## What this means",
        meaning,
        molecules,
    ]
    return "\n\n".join(p for p in parts if p) + "\n"


def meaning(verdicts: list[Verdict], seed: pd.DataFrame | None) -> str:
    """A paragraph for a reader with a NaN in their own GNN, built from the verdicts."""
    if seed is None:
        return "The seed case was not run, so there is nothing to say yet."
    by_id = {v.id: v for v in verdicts}
    first = seed.groupby("variant")["first_nan_epoch"]
    finite = [v for v, epochs in first if epochs.isna().all()]
    failed = [
        f"{v} (epoch {_number(epochs.median())})" for v, epochs in first if epochs.notna().any()
    ]
    text = (
        f"On this task the variants that stayed finite in every run were {', '.join(finite)}; "
        f"the others hit a NaN, at these median epochs: {', '.join(failed)}. "
        f"The first non-finite value of raw_e came from {by_id['C11'].numbers} "
        f"(C11 {by_id['C11'].verdict}). "
    )
    return text + (
        "If your loss or weights turn NaN, find the first op that goes non-finite before you "
        "tune the optimizer (`NanSentinel` or the trainer's replay names it). A NaN that starts "
        "in the forward pass is not an exploding gradient, and the optimizer-side remedies "
        f"here (gradient clipping: C6 {by_id['C6'].verdict}; a lower learning rate: C8 "
        f"{by_id['C8'].verdict}) act on how fast the logits grow, not on where `exp` breaks. "
        "Bound what feeds `exp` instead, by subtracting the segment max in the softmax, and "
        "compare the final MAE of every fix (C4, C9): squashing or constraining the input of "
        "the logit can cost accuracy or only postpone the NaN."
    )
