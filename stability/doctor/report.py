"""The doctor's report: ``<case>.doctor.csv``, one row per remedy, and ``<case>.doctor.md``,
the failure, why the table calls for its remedies, what each did, and the fix to make.

Every sentence is computed from the runs' rows (``stability.doctor.run``).
"""

from __future__ import annotations

import csv
import io
import math
import statistics
from collections.abc import Sequence
from pathlib import Path

from stability.core.files import atomic_writer
from stability.doctor.remedies import command
from stability.doctor.run import BUDGET_FACTOR, GUARD_NAMES, DoctorRun, Trial, median_epoch
from stability.model.op_guard import GUARDS, guard_named
from stability.model.remedy import HEADROOM, OP_GUARD, list_remedies
from stability.report.verdicts import DELAY_FACTOR, DELAYS, FIXES, NOT_APPLICABLE

#: The columns of ``<case>.doctor.csv``.
DOCTOR_FIELDS = (
    "remedy",
    "family",
    "runs",
    "avoided",
    "verdict",
    "first_failure_epoch",
    "final_mae",
    "mae_vs_best_fix",
    "mae_vs_original_best",
    "expected",
    "failure_epochs",
    "variant",
    "budget",
    "reason",
    "command",
    "epoch_time_vs_original",
    # Appended (issue 45): the class of fix the remedy is, and for an op guard the lines of
    # the user's code it rewrites, ``file:line: before => after``, separated by `` | ``.
    "fix_class",
    "code_fix",
    # Appended (issue 45): the fresh seeds a fix of the original seeds also trained, and
    # their failure epochs (empty: no failure within the budget).
    "fresh_seeds",
    "fresh_failure_epochs",
    # Appended (issue 45): what pushing a fix's data toward its limits did, in words
    # (``failed ...``, ``held ...`` or ``not pushed: ...``); empty when it was not pushed.
    "pushed",
)


def _g(value: float | None, digits: int = 4) -> str:
    return "" if value is None or not math.isfinite(value) else f"{value:.{digits}g}"


def _epoch(value: float) -> str:
    return "" if not math.isfinite(value) else f"{value:g}"


def trial_row(run: DoctorRun, trial: Trial, case_path: str) -> dict[str, str]:
    """One remedy's ``<case>.doctor.csv`` row."""
    symptom = run.finding.table_symptom
    verdict = trial.verdict(run.finding)
    applied = trial.case is not None and bool(trial.rows)
    epochs = trial.epochs if applied else []
    best_fix = run.recommended()
    best_fix_mae = best_fix.final_mae() if best_fix else None
    mae = trial.final_mae() if applied else None
    original_best = run.original_best_mae()
    return {
        "remedy": trial.remedy.name,
        "family": trial.remedy.family,
        "runs": str(len(trial.rows)) if applied else "0",
        "avoided": str(sum(e is None for e in epochs)) if applied else "",
        "verdict": verdict,
        "first_failure_epoch": _epoch(median_epoch(epochs)) if epochs else "",
        "final_mae": _g(mae),
        "mae_vs_best_fix": _g(mae / best_fix_mae) if mae and best_fix_mae else "",
        "mae_vs_original_best": _g(mae / original_best) if mae and original_best else "",
        "expected": "helps" if trial.remedy.expected(symptom) else "cannot help",
        "failure_epochs": ";".join("" if e is None else str(e) for e in epochs),
        "variant": ",".join(trial.case.variants) if trial.case else "",
        "budget": str(run.budget),
        "reason": trial.reason if verdict == NOT_APPLICABLE else trial.remedy.reason(symptom),
        "command": command(case_path, trial.case, run.case) if trial.case else "",
        "epoch_time_vs_original": _g(_ratio(epoch_seconds(trial), epoch_seconds(run.original)), 3),
        "fix_class": trial.remedy.fix_class,
        "code_fix": run.code_fix_text(trial),
        **_fresh_cells(trial),
        "pushed": trial.pushed.text if trial.pushed is not None else "",
    }


def _fresh_cells(trial: Trial) -> dict[str, str]:
    fresh = trial.fresh
    if fresh is None or fresh.case is None or not fresh.rows:
        return {"fresh_seeds": "", "fresh_failure_epochs": ""}
    return {
        "fresh_seeds": ";".join(str(r["seed"]) for r in fresh.rows),
        "fresh_failure_epochs": ";".join("" if e is None else str(e) for e in fresh.epochs),
    }


def epoch_seconds(trial: Trial) -> float | None:
    """The median over a trial's runs of their seconds per epoch trained (a run that failed
    stopped in its failing epoch): what a remedy costs in time, float64's among others."""
    values = []
    for row in trial.rows:
        seconds = float(row.get("wall_seconds") or "nan")
        epochs = float(row.get("first_nan_epoch") or row.get("epochs") or "nan")
        if math.isfinite(seconds) and math.isfinite(epochs) and epochs > 0:
            values.append(seconds / epochs)
    return statistics.median(values) if values else None


def _ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


def doctor_rows(run: DoctorRun, case_path: str) -> list[dict[str, str]]:
    return [trial_row(run, trial, case_path) for trial in run.trials]


def write_doctor_report(run: DoctorRun, out: Path, case_path: str) -> tuple[Path, Path]:
    """Write ``<case>.doctor.csv`` and ``<case>.doctor.md`` into ``out``, atomically."""
    rows = doctor_rows(run, case_path)
    csv_path = out / f"{run.case.name}.doctor.csv"
    md_path = out / f"{run.case.name}.doctor.md"
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=DOCTOR_FIELDS, lineterminator="\n")
    writer.writeheader()
    writer.writerows(rows)
    with atomic_writer(csv_path) as handle:
        handle.write(buffer.getvalue())
    with atomic_writer(md_path) as handle:
        handle.write(doctor_markdown(run, rows, case_path))
    return csv_path, md_path


def doctor_markdown(run: DoctorRun, rows: Sequence[dict[str, str]], case_path: str) -> str:
    parts = [f"# Doctor: `{run.variant}` on `{run.case.name}`", "", _setting(run, case_path), ""]
    parts += ["## The failure", "", *_failure(run), ""]
    if not run.trials:
        return "\n".join(parts)
    parts += ["## Why these remedies", "", *_why(run, rows), ""]
    parts += ["## The remedies, rerun", "", *_table(run, rows), ""]
    parts += ["## The fix", "", *_fix(run, rows), ""]
    as_code = _as_code(run, rows)
    if as_code:
        parts += ["## The fix as code", "", *as_code, ""]
    return "\n".join(parts)


def _as_code(run: DoctorRun, rows: Sequence[dict[str, str]]) -> list[str]:
    """Each op guard that fixes the failure, as the change in the user's code, with the
    command whose runs prove it."""
    lines = []
    for trial in run.trials:
        fixes = run.code_fixes(trial)
        if trial.verdict(run.finding) != FIXES or not fixes:
            continue
        row = next(r for r in rows if r["remedy"] == trial.remedy.name)
        lines += [f"`{trial.remedy.name}` ({trial.remedy.label}) fixes it:", ""]
        for fix in fixes:
            lines += [
                f"`{fix.where}`:",
                "",
                "```diff",
                f"- {fix.before}",
                f"+ {fix.after}",
                "```",
                "",
            ]
        lines += ["Proved by its runs:", "", "```bash", row["command"], "```", ""]
    return lines[:-1] if lines else []


def _setting(run: DoctorRun, case_path: str) -> str:
    case = run.original.case
    seeds = ", ".join(map(str, case.seeds))
    return (
        f"`python -m stability doctor {case_path} --variant {run.variant}`: seeds {seeds}, "
        f"batch {case.batch_sizes[0]}, learning rate {case.learning_rates[0]:g}, "
        f"{case.dtype}, {case.epochs} epochs; the runs of every remedy are in "
        f"`{run.case.name}.doctor/`."
    )


def _failure(run: DoctorRun) -> list[str]:
    finding = run.finding
    lines = []
    for row, epoch in zip(finding.rows, finding.epochs, strict=True):
        lines.append(f"- seed {row['seed']}: {_run_outcome(row, epoch)}")
    if finding.symptom is None:
        lines += [
            "",
            "No run failed, diverged or came near exp's limits: nothing to doctor in training. "
            "For the graph invariants a model breaks without a NaN, `python -m stability "
            f"check CASE --variant {run.variant} --doctor` doctors what the check finds.",
        ]
    elif finding.symptom == "input":
        lines += ["", *_bad_input(run)]
    else:
        lines += ["", f"Symptom: **{finding.symptom}**. {_budget_sentence(run)}"]
    return lines


#: How many of the graphs holding NaN or Inf the report names one by one.
_NAMED_GRAPHS = 20


def _bad_input(run: DoctorRun) -> list[str]:
    """The input failure: the first graph and field, and every graph that holds one."""
    bad = run.bad_input
    if not bad:
        return ["The first failure is in the input data: it holds NaN or Inf."]
    (graph, field), shown = bad[0], bad[:_NAMED_GRAPHS]
    listed = ", ".join(f"{g} ({f})" for g, f in shown)
    more = f", and {len(bad) - len(shown)} more" if len(bad) > len(shown) else ""
    return [
        f"The first failure is in the input data, before any training: {graph}'s {field} "
        f"hold NaN or Inf. {len(bad)} of the {run.num_graphs} graphs do: {listed}{more}.",
        "",
        "No remedy can train on such data, so none was tried: clean or drop these graphs "
        "(or set `allow_nonfinite_input = false`, the default, so that `run` refuses them "
        "with the first one named).",
    ]


def _run_outcome(row: dict, epoch: int | None) -> str:
    nan_epoch = (row.get("first_nan_epoch") or "").strip()
    if nan_epoch:
        where = ", ".join(
            f"{label} `{row[key]}`"
            for key, label in (("first_nan_layer", "layer"), ("first_nan_op", "op"))
            if (row.get(key) or "").strip()
        )
        return (
            f"failed at epoch {nan_epoch} (step {row.get('first_nan_step') or '?'}), stage "
            f"{row.get('first_nan_where')}{', ' + where if where else ''}; cause "
            f"**{row.get('failure_cause')}**"
        )
    if epoch is not None:
        return f"no NaN, but its validation MAE diverged at epoch {epoch}: {row.get('warning')}"
    if (row.get("warning") or "").strip():
        return f"finite, final MAE {row.get('final_mae')}; warning: {row['warning']}"
    return f"finite through {row.get('epochs')} epochs, final MAE {row.get('final_mae')}"


def _budget_sentence(run: DoctorRun) -> str:
    failed = [e for e in run.finding.epochs if e is not None]
    basis = f"the case's budget ({run.case.epochs})"
    if failed and BUDGET_FACTOR * max(failed) >= run.case.epochs:
        basis = f"{BUDGET_FACTOR} times the latest failure epoch ({max(failed)})"
    elif failed:
        basis += f", more than {BUDGET_FACTOR} times the latest failure epoch ({max(failed)})"
    return f"Every remedy reran the same seeds for {run.budget} epochs: {basis}."


def _why(run: DoctorRun, rows: Sequence[dict[str, str]]) -> list[str]:
    symptom = run.finding.table_symptom
    other_ops = [r for r in rows if _guard_of_another_op(r)]
    rows = [r for r in rows if r not in other_ops]
    helps = [r for r in rows if r["expected"] == "helps" and r["family"] != "candidate"]
    cannot = [r for r in rows if r["expected"] == "cannot help"]
    lines = [f"The doctor's table (docs/doctor.md) for **{symptom}**:", ""]
    if symptom != run.finding.symptom:
        named = ", ".join(run.finding.ops)
        lines[0] = (
            f"The {run.finding.symptom} is at {named}, which only multiplies and adds: no "
            f"exp made that Inf, so the doctor's table (docs/doctor.md) is read for "
            f"**{symptom}**:"
        )
    if other_ops:
        named = ", ".join(run.finding.ops) or "no op"
        lines += [
            f"The guards of other ops ({_names(other_ops)}) do not apply: the failure names "
            f"{named}.",
            "",
        ]
    lines += _producer_sentence(run, rows)
    if helps:
        lines += ["Expected to help:", ""]
        lines += [f"- `{r['remedy']}`: {run_reason(run, r)}" for r in helps]
        lines.append("")
    if cannot:
        lines += ["Expected not to help, tried anyway to show it:", ""]
        lines += [f"- `{r['remedy']}`: {run_reason(run, r)}" for r in cannot]
    return lines


def _producer_sentence(run: DoctorRun, rows: Sequence[dict[str, str]]) -> list[str]:
    """Which ops feed the failing op in its layer, and the guards of theirs tried there."""
    if not run.producer_ops:
        return []
    tried = [
        r
        for r in rows
        if r["remedy"] in GUARD_NAMES
        and r["verdict"] != NOT_APPLICABLE
        and not set(guard_named(r["remedy"]).op_types) & set(run.finding.ops)
    ]
    named = ", ".join(run.finding.ops)
    guarded = [op for op in run.producer_ops if any(op in g.op_types for g in GUARDS)]
    others = len(run.producer_ops) - len(guarded)
    rest = f"{others} op type{'s' if others != 1 else ''} without a guard"
    # A failure that names no op (weights that do not sum to 1) has its layer's ops instead.
    opening = (
        f"In `{run.finding.site}` the failing {named} is fed by"
        if named
        else f"`{run.finding.site}` computes its weights with"
    )
    if not guarded:
        return [f"{opening} {rest}.", ""]
    tail = (
        f"their guards were tried there{' too' if named else ''} "
        f"({_names(tried, with_verdict=True)})"
        if tried
        else "their guards could not apply there (the table says why)"
    )
    feeding = ", ".join(guarded) + (f" (and {rest})" if others else "")
    return [f"{opening} {feeding}: {tail}.", ""]


def _guard_of_another_op(row: dict[str, str]) -> bool:
    """An op guard left out because the failure names another op (``_guard_applies``)."""
    return (
        row["family"] == OP_GUARD
        and row["verdict"] == NOT_APPLICABLE
        and row["reason"].startswith("the failure names ")
    )


def run_reason(run: DoctorRun, row: dict[str, str]) -> str:
    """The table's reason for a remedy (its why-not, for one that cannot apply)."""
    trial = next(t for t in run.trials if t.remedy.name == row["remedy"])
    return trial.remedy.reason(run.finding.table_symptom)


def _table(run: DoctorRun, rows: Sequence[dict[str, str]]) -> list[str]:
    lines = [
        "| remedy | family | expected | runs | avoided | verdict | median failure epoch | "
        "final MAE | vs best fix | vs original best | time per epoch vs original |",
        "| --- | --- | --- | ---: | ---: | --- | ---: | ---: | ---: | ---: | ---: |",
    ]
    for r in rows:
        verdict = f"**{r['verdict']}**" if r["verdict"] == FIXES else r["verdict"]
        if r["verdict"] == NOT_APPLICABLE:
            verdict = f"not applicable: {r['reason']}"
        epoch = r["first_failure_epoch"] or ("none" if r["runs"] != "0" else "")
        lines.append(
            f"| `{r['remedy']}` | {r['family']} | {r['expected']} | {r['runs']} | "
            f"{r['avoided']} | {verdict} | {epoch} | {r['final_mae']} | "
            f"{r['mae_vs_best_fix']} | {r['mae_vs_original_best']} | "
            f"{r['epoch_time_vs_original']} |"
        )
    original = run.original_best_mae()
    before = median_epoch(run.finding.epochs)
    lines += [
        "",
        f"The rule: **fixes** when no run fails within the {run.budget} epochs"
        + (" and none keeps the headroom warning" if run.finding.symptom == HEADROOM else "")
        + f"; **delays** when the median failure epoch is at least {DELAY_FACTOR:g} times "
        f"the original's ({_epoch(before) or 'none'}); else **does not help**. A run "
        "without a failure counts as failing beyond the budget. Final MAE: the median over "
        "the runs that have one; *vs best fix* divides it by the recommended fix's, *vs "
        "original best* by the original runs' median best MAE before they failed ("
        f"{_g(original) or 'none'}). *Time per epoch vs original*: the median seconds per "
        "epoch of its runs over the original runs', as this doctor's runs measured them (how "
        "many runs trained at once, and other work on the machine, move it).",
    ]
    return lines


def _names(rows: Sequence[dict[str, str]], with_verdict: bool = False) -> str:
    """``a`` (verdict), ``b`` ...: remedies named in a sentence."""
    return ", ".join(
        f"`{r['remedy']}`" + (f" ({r['verdict']})" if with_verdict else "") for r in rows
    )


def _fix(run: DoctorRun, rows: Sequence[dict[str, str]]) -> list[str]:
    best = run.recommended()
    symptom = run.finding.symptom
    lines = []
    if best is None:
        delayed = [r for r in rows if r["verdict"] == DELAYS]
        tail = f"; {_names(delayed)} delayed it." if delayed else "."
        lines.append(f"No remedy fixed the {symptom} within {run.budget} epochs{tail}")
    else:
        row = next(r for r in rows if r["remedy"] == best.remedy.name)
        ratio = row["mae_vs_original_best"]
        versus = f", {ratio} times the original's best" if ratio else ""
        others = [f"`{t.remedy.name}` ({t.remedy.fix_class})" for t in run.fixes()[1:]]
        rest = f" The other fixes, in that order: {', '.join(others)}." if others else ""
        lines.append(
            f"Recommended: **`{best.remedy.name}`** ({best.remedy.label}), {_why_best(run, best)} "
            f"(final MAE {row['final_mae'] or 'none'}{versus}).{rest}"
        )
        lines += ["", f"In your code: {best.remedy.code}.", "", "Its runs, again:", ""]
        lines += ["```bash", row["command"], "```"]
    lines += _fresh_sentences(rows)
    lines += _pushed_sentences(run)
    tried = [r for r in rows if r["verdict"] != NOT_APPLICABLE and r["family"] != "candidate"]
    held = [r for r in tried if r["expected"] == "cannot help" and r["verdict"] != FIXES]
    surprises = [r for r in tried if r["expected"] == "cannot help" and r["verdict"] == FIXES]
    misses = [r for r in tried if r["expected"] == "helps" and r["verdict"] != FIXES]
    lines.append("")
    if held:
        lines.append(f"As the table says, {_names(held, True)} did not fix the {symptom}.")
    if surprises:
        lines.append(
            f"Against the table, {_names(surprises)} fixed it within the budget: the "
            "table's reason does not hold for these runs."
        )
    if misses:
        lines.append(f"Expected to help, but not a fix here: {_names(misses, True)}.")
    return lines


def _why_best(run: DoctorRun, best: Trial) -> str:
    """Why the doctor recommends ``best`` (``DoctorRun.recommendation``), from the fixes."""
    fixes = run.fixes()
    kept = [t for t in fixes if run.keeps_accuracy(t)]
    if run.original_best_mae() is None:
        among = "of the fixes"
    elif run.keeps_accuracy(best):
        among = f"of the {len(kept)} fixes that end at or below the original's best MAE"
    else:
        among = "of the fixes (none ends at or below the original's best MAE)"
    same = [t for t in fixes if t.remedy.fix_class == best.remedy.fix_class]
    tie = ", the lowest final MAE of its class" if len(same) > 1 else ""
    return f"the most local change {among}: a fix of class {best.remedy.fix_class}{tie}"


def _fresh_sentences(rows: Sequence[dict[str, str]]) -> list[str]:
    """Which fixes of the original seeds held on the fresh seeds, and which did not."""
    confirmed = [r for r in rows if r["fresh_seeds"]]
    if not confirmed:
        return []
    seeds = ", ".join(confirmed[0]["fresh_seeds"].split(";"))
    held = [r for r in confirmed if not r["fresh_failure_epochs"].replace(";", "")]
    failed = [r for r in confirmed if r not in held]
    lines = ["", f"Every fix of the original seeds was retrained on fresh seeds ({seeds}):"]
    if held:
        lines.append(f"{_names(held)} held on them too.")
    if failed:
        lines.append(f"{_names(failed, True)} failed on at least one of them.")
    return ["", " ".join(lines[1:])]


def _pushed_sentences(run: DoctorRun) -> list[str]:
    """What pushing the fixes' data toward their limits did, fix by fix, in the order they
    were pushed (``push_fixes``)."""
    if not run.pushed:
        return []
    told = "; ".join(f"`{t.remedy.name}` {t.pushed.text}" for t in run.pushed)
    held = any(t.pushed.tried and not t.pushed.breaks_fix for t in run.pushed)
    until = ", until one held" if held else ""
    lines = [f"The fixes, in the order recommended, were then pushed by the hunt{until}: {told}."]
    if not held and any(t.pushed.tried for t in run.pushed):
        lines.append("No fix held on the data the hunt pushed.")
    return ["", " ".join(lines)]


#: The comments around the rendered table in docs/doctor.md (``with_remedy_table``).
TABLE_BEGIN = "<!-- remedy table: rendered by stability.doctor.report.remedy_table -->"
TABLE_END = "<!-- end of the remedy table -->"


def remedy_table() -> str:
    """The table of docs/doctor.md: every remedy, what it changes, and for which symptoms
    the table expects it to help (and why), rendered from the registry of remedies
    (``stability.model.remedies``)."""
    rows = [
        "| remedy | family | what it changes | expected to help, and why | cannot help otherwise, "
        "because |",
        "| --- | --- | --- | --- | --- |",
    ]
    for remedy in list_remedies():
        helps = "; ".join(f"*{symptom}*: {why}" for symptom, why in remedy.helps.items())
        rows.append(
            f"| `{remedy.name}` | {remedy.family} | {remedy.label}; in code: {remedy.code} | "
            f"{helps} | {remedy.cannot} |"
        )
    return "\n".join(rows) + "\n"


def with_remedy_table(doc: str) -> str:
    """``doc`` (docs/doctor.md's text) with the table between its markers rendered again."""
    start, end = doc.index(TABLE_BEGIN) + len(TABLE_BEGIN), doc.index(TABLE_END)
    return f"{doc[:start]}\n{remedy_table()}\n{doc[end:]}"
