"""The seed in float64: the claims judged on ``cases/seed_float64.toml`` beside float32.

The seed's answer says two things float32 cannot produce: ``exp`` overflows "above e^709"
(float64's line; float32's is 88.72), and the attention logits reached "hundreds [...]
thousands" (far past float32's lines). This module builds the section of ``claims.md`` that
reads the float64 case's rows and history: each claim the case can judge with its float32
and float64 verdicts, each ``raw_e`` run's failure against float64's ``exp`` lines, and
whether its logits reached the hundreds before the failure. Every sentence is computed from
the rows; nothing here knows an expected answer.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np
import pandas as pd

from stability.claims.rules import Rules
from stability.claims.stats import ClaimInputs
from stability.claims.table import (
    BY_ID,
    CLAIM_TABLE,
    MECHANISM,
    NOT_RUN,
    Verdict,
    by_role,
    family,
    judge,
)
from stability.core.failures import failure_cause
from stability.core.limits import exp_limits

#: The float64 seed case: its name (``cases/<name>.toml``, ``reports/<name>.csv``).
CASE = "seed_float64"
#: The command that makes its rows, named when they are absent.
COMMAND = f"python -m stability run cases/{CASE}.toml --out reports/ --overwrite --workers 2"

#: The seed's two statements this section tests, verbatim (``tests/test_claims_dtype.py``
#: checks them against the seed's text).
QUOTES = {
    "overflow": '"Anything above e\u2077\u2070\u2079 results in a numerical overflow in Python."',
    "hundreds": '"I observed some outputs in order of hundreds and slowly reaching thousands as '
    'the training progresses."',
}
#: "in order of hundreds" and "reaching thousands", as max |attention logit|.
HUNDREDS, THOUSANDS = 100.0, 1000.0

#: claim -> the variants its rule reads, for the claims that read the seed case (the float64
#: case's twin); the others need another case (other batch sizes or learning rates), which has
#: no float64 twin. A view of ``claims.CLAIM_TABLE``.
CLAIM_VARIANTS = {c.id: c.reads.variants for c in CLAIM_TABLE if c.reads.case == "seed"}


def judgeable(variants: Sequence[str]) -> list[str]:
    """The claims, in ``CLAIM_TABLE`` order, whose variants are all among ``variants``."""
    have = set(variants)
    return [c for c, needs in CLAIM_VARIANTS.items() if set(needs) <= have]


def float64_section(
    frame: pd.DataFrame | None,
    history: pd.DataFrame | None,
    float32: Sequence[Verdict],
    inputs: ClaimInputs,
    rules: Rules,
) -> str:
    """The ``claims.md`` section on the float64 case (``frame``, its rows; ``history``, its
    per-epoch history or None); ``float32`` are the main verdicts, ``inputs`` the main
    cases' (their train size, batch and learning rate)."""
    head = "## The seed in float64"
    if frame is None:
        return (
            f"{head}\n\n`reports/{CASE}.csv` is absent, so the claims are judged in float32 "
            f"only. `{COMMAND}` makes it (`tox -e report` runs it); "
            "`python -m stability claims --no-run --out reports/` then adds this section."
        )
    setting = f"batch {inputs.seed_batch_size}, learning rate {inputs.seed_learning_rate:g}"
    rows = frame[
        (frame["batch_size"] == inputs.seed_batch_size)
        & np.isclose(frame["learning_rate"], inputs.seed_learning_rate)
    ]
    if rows.empty:
        return f"{head}\n\n`reports/{CASE}.csv` has no rows at the seed's setting ({setting})."
    # The float32 inputs with the float64 rows as the seed case, and no batch or rate cases.
    f64 = replace(inputs, seed=rows, batch_size=None, learning_rate=None)
    raw = rows[rows["variant"] == "raw_e"].sort_values("seed")
    dtypes = ", ".join(sorted(set(rows["dtype"].astype(str))))
    budget = int(rows["epochs"].max())
    parts = [
        head,
        f"[{CASE}]({CASE}.md): the seed case's data and model at dtype {dtypes}, variants "
        f"{', '.join(sorted(set(rows['variant'])))}; seeds "
        f"{', '.join(str(s) for s in sorted(set(rows['seed'])))}; {setting}; {budget} epochs. "
        "The same rules as above, float32's verdicts from the table above.",
    ]
    verdicts = judge(f64, rules)
    parts.append(_verdict_table(verdicts, float32, sorted(set(rows["variant"]))))
    parts.append(_budget_note(f64, verdicts, rules, budget))
    if raw.empty:
        parts.append("The float64 case has no raw_e rows, so its failures are not known here.")
        return "\n\n".join(parts)
    runs = [_run(row, history) for _, row in raw.iterrows()]
    parts += [_limits_part(runs, str(rows["dtype"].iloc[0])), _hundreds_part(runs)]
    return "\n\n".join(parts)


def _verdict_table(f64: list[Verdict], f32: Sequence[Verdict], variants: list[str]) -> str:
    ids = judgeable(variants)
    by32, by64 = {v.id: v for v in f32}, {v.id: v for v in f64}
    table = pd.DataFrame(
        [
            {
                "id": c,
                "tested": BY_ID[c].tested,
                "float32": by32[c].verdict if c in by32 else "-",
                "float64": by64[c].verdict,
                "float64 numbers": by64[c].numbers,
                "float64 why not": by64[c].why or "",
            }
            for c in ids
        ]
    )
    changed = [
        f"{c} ({by32[c].verdict} in float32, {by64[c].verdict} in float64)"
        for c in ids
        if c in by32 and by32[c].verdict != by64[c].verdict
    ]
    change = (
        f"The dtype changes {len(changed)} of these {len(ids)} verdicts: {', '.join(changed)}."
        if changed
        else f"The dtype changes none of these {len(ids)} verdicts."
    )
    missing = [c.id for c in CLAIM_TABLE if c.id not in ids]
    absent = _absent(missing, variants)
    return "\n\n".join(p for p in (_markdown(table), change, absent) if p)


def _budget_note(f64: ClaimInputs, verdicts: list[Verdict], rules: Rules, budget: int) -> str:
    """Whether the budget lets the *avoids* rule judge, in numbers."""
    raw = f64.seed_stats("raw_e")
    if raw is None or not raw.nans or not math.isfinite(raw.median_epoch):
        return (
            f"raw_e did not fail in most float64 runs within {budget} epochs, so the *avoids* "
            "rule has no reference here."
        )
    needed = rules.avoid_budget_factor * raw.median_epoch
    if budget >= needed:
        return (
            f"The budget ({budget} epochs) is at least {rules.avoid_budget_factor:g} x raw_e's "
            f"float64 median first-failure epoch ({_fmt(raw.median_epoch)}), so the *avoids* "
            "rule can judge."
        )
    ids = judgeable(sorted(set(f64.seed["variant"])))
    idle = [v.id for v in verdicts if v.id in ids and v.verdict == NOT_RUN]
    return (
        f"The budget ({budget} epochs) is under {rules.avoid_budget_factor:g} x raw_e's float64 "
        f"median first-failure epoch ({_fmt(raw.median_epoch)}), that is {_fmt(needed)} "
        "epochs, so a variant that stays finite cannot be called avoiding"
        + (f": {', '.join(idle)} are *not run* in float64." if idle else ".")
    )


def _absent(missing: list[str], variants: list[str]) -> str:
    """One line: the claims the float64 case cannot judge, grouped by why."""
    if not missing:
        return ""
    reasons: dict[str, list[str]] = {}
    for claim in missing:
        reads = BY_ID[claim].reads
        if reads.case != "seed":
            why = "they need other batch sizes or learning rates, which it does not vary"
        else:
            lack = [v for v in reads.variants if v not in variants]
            why = f"no {', '.join(lack)} rows"
        reasons.setdefault(why, []).append(claim)
    groups = [f"{', '.join(claims)} ({why})" for why, claims in reasons.items()]
    return f"Not in the float64 case: {'; '.join(groups)}."


@dataclass(frozen=True)
class RawRun:
    """One float64 ``raw_e`` run: its failure and its logits, from its row and history."""

    seed: int
    budget: int
    failure_epoch: float  # NaN for a run that stayed finite
    cause: str
    op: str
    #: At the failure epoch (or the run's extremes without a history): the largest ``exp``
    #: argument and the smallest per-node max logit, signed.
    high: float
    low: float
    from_history: bool
    #: The epochs before the failure (every epoch of a finite run): the first with
    #: max |logit| >= HUNDREDS, and the largest max |logit|; NaN without a history.
    first_hundred: float
    largest_before: float
    #: The largest ``exp`` argument (signed) in those epochs; NaN without a history.
    high_before: float

    @property
    def failed(self) -> bool:
        return math.isfinite(self.failure_epoch)


def _run(row: pd.Series, history: pd.DataFrame | None) -> RawRun:
    epoch = float(row["first_nan_epoch"]) if pd.notna(row["first_nan_epoch"]) else math.nan
    epochs = _epochs(row, history)
    at_failure = epochs[epochs["epoch"] == epoch] if math.isfinite(epoch) else epochs.iloc[0:0]
    source = at_failure if len(at_failure) else None
    before = epochs[epochs["epoch"] < epoch] if math.isfinite(epoch) else epochs
    logits = before["max_abs_logit"].astype(float)
    reached = before.loc[logits >= HUNDREDS, "epoch"]
    return RawRun(
        seed=int(row["seed"]),
        budget=int(row["epochs"]),
        failure_epoch=epoch,
        cause=failure_cause(row),
        op=str(row["first_nan_op"]) if pd.notna(row.get("first_nan_op")) else "-",
        high=_value(source if source is not None else row, "max_exp_arg"),
        low=_value(source if source is not None else row, "min_node_max_logit"),
        from_history=source is not None,
        first_hundred=float(reached.min()) if len(reached) else math.nan,
        largest_before=float(logits.max()) if logits.notna().any() else math.nan,
        high_before=_largest(before, "max_exp_arg"),
    )


def _epochs(row: pd.Series, history: pd.DataFrame | None) -> pd.DataFrame:
    """The run's history rows (empty without a history)."""
    columns = ["epoch", "max_abs_logit", "max_exp_arg", "min_node_max_logit"]
    if history is None:
        return pd.DataFrame(columns=columns)
    mine = history[
        (history["variant"] == row["variant"])
        & (history["seed"] == row["seed"])
        & (history["batch_size"] == row["batch_size"])
        & np.isclose(history["learning_rate"], row["learning_rate"])
    ]
    return mine.sort_values("epoch")


def _largest(epochs: pd.DataFrame, column: str) -> float:
    if column not in epochs:
        return math.nan
    values = pd.to_numeric(epochs[column], errors="coerce").dropna()
    return float(values.max()) if len(values) else math.nan


def _value(source: pd.DataFrame | pd.Series, column: str) -> float:
    if column not in source:
        return math.nan
    values = pd.to_numeric(pd.Series(source[column]), errors="coerce").dropna()
    return float(values.iloc[0]) if len(values) else math.nan


def _markdown(table: pd.DataFrame) -> str:
    # Cells are text as written: number parsing would drop the "+" of a signed logit.
    return table.to_markdown(index=False, disable_numparse=True)


def _fmt(value: float, signed: bool = False) -> str:
    if not math.isfinite(value):
        return "-"
    return f"{value:+.2f}" if signed else f"{value:.4g}"


def _count(runs: list[RawRun], total: int, noun: str = "") -> str:
    """ "2 of 3 <noun> (seeds 0, 1)", or "none of 3 <noun>"."""
    of = f"of {total} {noun}".rstrip()
    if not runs:
        return f"none {of}"
    return f"{len(runs)} {of} (seeds {', '.join(str(r.seed) for r in runs)})"


def _limits_part(runs: list[RawRun], dtype: str) -> str:
    """The mechanism claims in float64: each raw_e failure's signed logits against exp's
    two lines."""
    limits = exp_limits(dtype)
    over, under = limits.overflow, -limits.underflow
    table = pd.DataFrame(
        [
            {
                "seed": r.seed,
                "first failure epoch": _fmt(r.failure_epoch) if r.failed else f"none in {r.budget}",
                "failure cause": r.cause,
                "op": r.op,
                "largest exp argument": _fmt(r.high, signed=True),
                f"to {over:+.2f} (< 0: crossed)": _fmt(over - r.high, signed=True),
                "smallest per-node max logit": _fmt(r.low, signed=True),
                f"to {under:+.2f} (< 0: crossed)": _fmt(r.low - under, signed=True),
            }
            for r in runs
        ]
    )
    failed = [r for r in runs if r.failed]
    lead = (
        f"### {family(by_role(MECHANISM))} in float64: the failure against {QUOTES['overflow']}\n\n"
        f"{limits.dtype}'s `exp` overflows above {over:+.2f} (ln of its largest number) and a "
        f"node's whole segment flushes to 0 below {under:+.2f} (ln of its smallest normal "
        f"number), where the naive softmax computes 0/0 (`stability/core/limits.py`)."
    )
    if not failed:
        return (
            f"{lead} No raw_e run failed within its budget "
            f"({', '.join(str(r.budget) for r in runs)} epochs).\n\n{_markdown(table)}"
        )
    source = (
        "at the failure epoch (the history's last epoch, which includes the failing step)"
        if all(r.from_history for r in failed)
        else "over each run (the result row; the history is absent for some runs)"
    )
    if len(failed) < len(runs):
        source += "; for a run that stayed finite, over the whole run (the result row)"
    crossed_over = [r for r in failed if r.high > over]
    crossed_under = [r for r in failed if r.low < under]
    neither = [r for r in failed if r not in crossed_over and r not in crossed_under]
    epochs = [r.failure_epoch for r in failed]
    text = (
        f"{lead} {len(failed)} of {len(runs)} raw_e runs failed, at epochs "
        f"{', '.join(_fmt(e) for e in epochs)} (median {_fmt(float(np.median(epochs)))}); "
        f"their causes: {', '.join(sorted({r.cause for r in failed}))}. The signed logits "
        f"below are {source}. The largest exp argument was above {over:+.2f} in "
        f"{_count(crossed_over, len(failed), 'failing runs')}; the smallest per-node max logit "
        f"was below {under:+.2f} in {_count(crossed_under, len(failed))}"
    )
    if neither:
        text += f"; neither line was crossed in {_count(neither, len(failed))}"
    return f"{text}.\n\n{_markdown(table)}"


def _hundreds_part(runs: list[RawRun]) -> str:
    """Did raw_e's max |logit| reach the hundreds (and thousands) before its failure?"""
    head = f"### Logits before the failure: {QUOTES['hundreds']}"
    if all(math.isnan(r.largest_before) for r in runs):
        return f"{head}\n\nThe float64 case has no history, so the logits per epoch are not known."
    table = pd.DataFrame(
        [
            {
                "seed": r.seed,
                "first failure epoch": _fmt(r.failure_epoch) if r.failed else f"none in {r.budget}",
                f"first epoch with max abs logit >= {HUNDREDS:g}": _fmt(r.first_hundred),
                "largest max abs logit before the failure": _fmt(r.largest_before),
                f"reached {THOUSANDS:g}": "yes" if r.largest_before >= THOUSANDS else "no",
                "largest exp argument before the failure": _fmt(r.high_before, signed=True),
            }
            for r in runs
        ]
    )
    hundred = [r for r in runs if math.isfinite(r.first_hundred)]
    thousand = [r for r in runs if r.largest_before >= THOUSANDS]
    largest = max(r.largest_before for r in runs if math.isfinite(r.largest_before))
    text = (
        f"{head}\n\nThe history records each epoch's max abs attention logit (its sign is lost). "
        "Before the failure means the epochs before the first failure's epoch (every epoch "
        "of a run that stayed finite). "
    )
    if hundred:
        firsts = [r.first_hundred for r in hundred]
        text += (
            f"The max abs logit reached {HUNDREDS:g} before the failure in "
            f"{_count(hundred, len(runs), 'raw_e runs')}, first at epoch "
            f"{_fmt(min(firsts))}"
            + (f" to {_fmt(max(firsts))}" if max(firsts) != min(firsts) else "")
            + f"; the largest before the failure was {_fmt(largest)}. "
        )
    else:
        text += (
            f"In no raw_e run did the max abs logit reach {HUNDREDS:g} before the failure; "
            f"the largest was {_fmt(largest)}. "
        )
    text += f"It reached {THOUSANDS:g} in {_count(thousand, len(runs))}." + _sign(hundred)
    return f"{text}\n\n{_markdown(table)}"


def _sign(hundred: list[RawRun]) -> str:
    """Were the logits of magnitude >= HUNDREDS positive (into exp's overflow) or negative?"""
    known = [r for r in hundred if math.isfinite(r.high_before)]
    if not known:
        return ""
    positive = [r for r in known if r.high_before >= HUNDREDS]
    if not positive:
        top = max(r.high_before for r in known)
        return (
            f" Their sign: the largest exp argument before the failure stayed below "
            f"{HUNDREDS:+g} in every one of these runs (at most {top:+.2f}), so the logits "
            f"of magnitude {HUNDREDS:g} and more were negative."
        )
    return (
        f" Their sign: the largest exp argument before the failure reached {HUNDREDS:+g} "
        f"in {_count(positive, len(known))}, so positive logits of that size occurred."
    )
