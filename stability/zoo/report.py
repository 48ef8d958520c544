"""The zoo's report: ``zoo.csv``, one row per bug (the harness, the doctor and the tools
people use today against the bug's ground truth), and ``zoo.md``, the scoreboard.

Every figure and sentence is computed from the rows.
"""

from __future__ import annotations

import csv
import io
from collections.abc import Sequence
from pathlib import Path

from stability.core.files import atomic_writer
from stability.model.op_guard import guard_named
from stability.model.remedy import Remedy, chain_parts, get_remedy
from stability.report.verdicts import NOT_APPLICABLE
from stability.zoo.run import ZooEntry

#: The tools people use today, and the harness's own callback for ``fit``, by the prefix of
#: their columns in ``zoo.csv`` (``stability.zoo.tools.TOOLS``).
TOOL_NAMES = {
    "terminate_on_nan": "Keras TerminateOnNaN",
    "check_numerics": "tf.debugging.enable_check_numerics",
    "nan_sentinel": "stability.NanSentinel (the harness in your own fit)",
}
_TOOL_COLUMNS = ("detected", "stage", "stage_right", "localized", "op", "step", "ms_per_step")

#: The columns of ``zoo.csv``; the booleans are ``True``/``False``.
ZOO_FIELDS = (
    "bug",
    "source",
    "expected_stage",
    "reported_stage",
    "detected",
    "stage_right",
    "cause_right",
    "localized",
    "fixed",
    "expected_cause",
    "reported_cause",
    "expected_op",
    "reported_op",
    "reported_layer",
    "failure_epoch",
    "silent",
    "doctor_fix",
    "doctor_verdicts",
    *(f"{tool}_{column}" for tool in TOOL_NAMES for column in _TOOL_COLUMNS),
    "url",
    # Appended: the cause NanSentinel names in fit, and whether its stage, op and cause are
    # the harness's own (issue 43: one failure pipeline for both).
    "nan_sentinel_cause",
    "nan_sentinel_agrees",
    # Appended: ``stability check`` without training (issue 46), on the bug's own data and on
    # generated graphs alone; the properties that failed, the first failure's stage and op,
    # the seconds until it, and whether it names the bug (``check_right``).
    "invariant",
    "check_own_data",
    "check_generated",
    "check_right",
    "check_properties_own",
    "check_properties_generated",
    "check_stage",
    "check_op",
    "check_seconds_own",
    "check_seconds_generated",
    # Appended (issue 45): the class of the maintainers' fix, the class of the doctor's
    # recommended fix, whether that fix is right (the same class, or a guard at the bug's
    # op), and for an op guard the line of the bug's code it rewrites.
    "fix_class",
    "doctor_fix_class",
    "fix_right",
    "doctor_fix_code",
    # Appended (issue 45): where the doctor's fix was proved, ``training`` (the doctor's
    # retraining) or ``check`` (for a bug training does not show failing, the doctor of the
    # invariants the check finds broken, proved by checking again), and that doctor's
    # verdicts.
    "doctor_fix_from",
    "check_repair_verdicts",
)

#: The check's goals: detected on own data, from generated graphs alone, and the median
#: seconds until it detects a bug.
CHECK_GOALS = {"check_own_data": 0.90, "check_generated": 0.70}
CHECK_SECONDS_GOAL = 5.0

#: The settings of the check's score (``stability.check.outcome.SETTINGS``), by their
#: column's suffix.
_CHECK_SETTINGS = {"own": "own data", "generated": "generated"}

#: (name in the scoreboard, prefix of its columns in ``zoo.csv``, the scores it has).
TOOLS = (
    (
        "stability (this harness)",
        "",
        ("detected", "stage_right", "cause_right", "localized", "fixed"),
    ),
    *(
        (name, f"{tool}_", ("detected", "stage_right", "localized"))
        for tool, name in TOOL_NAMES.items()
    ),
)
#: The issue's goals for the harness: score -> least rate.
GOALS = {"detected": 0.95, "stage_right": 0.90, "cause_right": 0.80, "fixed": 0.70}
#: The doctor's goals: fixed among the bugs the harness detects in training (the doctor
#: has a failure to treat), and a fix of the maintainers' class (or a guard at the bug's
#: op) over the whole zoo.
FIXED_FAILING_GOAL = 22 / 24
FIX_RIGHT_GOAL = 0.75


def _bool(value: bool) -> str:
    return "True" if value else "False"


def _op_matches(expected: str, reported: str | None) -> bool:
    return bool(reported) and expected.lower() in str(reported).lower()


def _tool_cells(tool: str, run: dict, bug) -> dict[str, str]:
    detected = bool(run.get("detected"))
    stage_right = detected and run.get("stage") == bug.stage
    ms = run.get("ms_per_step")
    return {
        f"{tool}_detected": _bool(detected),
        f"{tool}_stage": run.get("stage") or "",
        f"{tool}_stage_right": _bool(stage_right),
        f"{tool}_localized": _bool(stage_right and _op_matches(bug.op, run.get("op"))),
        f"{tool}_op": run.get("op") or "",
        f"{tool}_step": str(run.get("step") or ""),
        f"{tool}_ms_per_step": f"{ms:.3g}" if ms is not None else "",
    }


def zoo_row(entry: ZooEntry) -> dict[str, str]:
    """One bug's ``zoo.csv`` row."""
    bug, doctor = entry.bug, entry.doctor
    finding = doctor.finding
    first = finding.first if finding.symptom not in (None, "headroom") else None
    reported_stage = (first or {}).get("first_nan_where") or ""
    reported_cause = finding.symptom if first is not None else "none"
    reported_op = (first or {}).get("first_nan_op") or ""
    best = doctor.recommended()
    stage_right = first is not None and reported_stage == bug.stage
    verdicts = [f"{t.remedy.name}:{t.verdict(finding)}" for t in doctor.trials]
    row = {
        "bug": bug.name,
        "source": bug.source,
        "expected_stage": bug.stage,
        "reported_stage": reported_stage,
        "detected": _bool(first is not None),
        "stage_right": _bool(stage_right),
        "cause_right": _bool(reported_cause == bug.cause),
        "localized": _bool(stage_right and _op_matches(bug.op, reported_op)),
        "fixed": _bool(best is not None),
        "expected_cause": bug.cause,
        "reported_cause": reported_cause or "none",
        "expected_op": bug.op,
        "reported_op": reported_op,
        "reported_layer": (first or {}).get("first_nan_layer") or "",
        "failure_epoch": str(min((e for e in finding.epochs if e is not None), default="")),
        "silent": _bool(bug.silent),
        "doctor_fix": best.remedy.name if best else "",
        "fix_class": bug.fix_class,
        "doctor_fix_class": best.remedy.fix_class if best else "",
        "fix_right": _bool(best is not None and fix_right(best.remedy, bug)),
        "doctor_fix_code": doctor.code_fix_text(best),
        "doctor_verdicts": ";".join(v for v in verdicts if not v.endswith(NOT_APPLICABLE)),
        "url": bug.url,
    }
    for tool in TOOL_NAMES:
        row.update(_tool_cells(tool, entry.tools.get(tool, {}), bug))
    sentinel = entry.tools.get("nan_sentinel", {})
    row["nan_sentinel_cause"] = sentinel.get("cause") or ""
    row["nan_sentinel_agrees"] = _bool(sentinel_agrees(row))
    row.update(check_cells(entry.check, bug))
    row["doctor_fix_from"] = "training" if best is not None else ""
    row.update(repair_cells(entry.check.get("repair") if first is None else None, bug))
    return row


def repair_cells(repair: dict | None, bug) -> dict[str, str]:
    """For a bug training does not show failing, the doctor's fix columns from the doctor of
    the invariants the check finds broken (``Checker``); none where it was not run."""
    if not repair:
        return {"check_repair_verdicts": ""}
    cells = {"check_repair_verdicts": repair.get("verdicts", "")}
    if not repair.get("recommended"):
        return cells
    remedy = get_remedy(repair["recommended"])
    return {
        **cells,
        "fixed": "True",
        "doctor_fix": remedy.name,
        "doctor_fix_class": remedy.fix_class,
        "fix_right": _bool(fix_right(remedy, bug)),
        "doctor_fix_code": repair.get("code", ""),
        "doctor_fix_from": "check",
    }


def fix_right(remedy: Remedy, bug) -> bool:
    """Whether the doctor's fix is of the maintainers' class, or a guard at the bug's op."""
    if remedy.fix_class == bug.fix_class:
        return True
    if not remedy.is_op_guard:
        return False
    # A chain of guards (``guard_pow+guard_pow@layer``) is right when one guards the bug's op.
    guards = chain_parts(remedy.name)
    return any(_op_matches(bug.op, op) for g in guards for op in guard_named(g).op_types)


def check_cells(check: dict, bug) -> dict[str, str]:
    """The check's columns: empty where the check was not run."""
    cells = {"invariant": bug.invariant}
    if not check:
        return {**cells, **{f: "" for f in ZOO_FIELDS[ZOO_FIELDS.index("check_own_data") :]}}
    own, generated = (check[_CHECK_SETTINGS[k]] for k in ("own", "generated"))
    first = own if own["detected"] else generated
    return {
        **cells,
        "check_own_data": _bool(own["detected"]),
        "check_generated": _bool(generated["detected"]),
        "check_right": _bool(check_right(own, bug) or check_right(generated, bug)),
        "check_properties_own": ";".join(own["properties"]),
        "check_properties_generated": ";".join(generated["properties"]),
        "check_stage": first["stage"] or "",
        "check_op": first["op"] or "",
        "check_seconds_own": f"{own['seconds']:.2f}",
        "check_seconds_generated": f"{generated['seconds']:.2f}",
    }


def check_right(scored: dict, bug) -> bool:
    """Whether the check names the bug: a silent bug's invariant fails, or the step fails
    in the bug's stage with its op (a bug that makes a NaN)."""
    if bug.invariant:
        return bug.invariant in scored["properties"]
    return (
        "step" in scored["properties"]
        and scored["stage"] == bug.stage
        and _op_matches(bug.op, scored["op"])
    )


def sentinel_agrees(row: dict[str, str]) -> bool:
    """Whether ``NanSentinel`` in fit named the harness's stage, op and cause (both found
    no failure, or both found the same one)."""
    if row["detected"] != row["nan_sentinel_detected"]:
        return False
    if row["detected"] != "True":
        return True
    return (row["nan_sentinel_stage"], row["nan_sentinel_op"], row["nan_sentinel_cause"]) == (
        row["reported_stage"],
        row["reported_op"],
        row["reported_cause"],
    )


def zoo_command_line(names: Sequence[str] = ()) -> str:
    """The command that ran these bugs, as the scoreboard shows it."""
    return "python -m stability zoo" + (f" --bugs {','.join(names)}" if names else "")


def write_zoo_report(entries: Sequence[ZooEntry], out: Path, command: str) -> tuple[Path, Path]:
    """Write ``zoo.csv`` and ``zoo.md`` into ``out``, atomically."""
    rows = [zoo_row(entry) for entry in entries]
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=ZOO_FIELDS, lineterminator="\n")
    writer.writeheader()
    writer.writerows(rows)
    csv_path, md_path = out / "zoo.csv", out / "zoo.md"
    with atomic_writer(csv_path) as handle:
        handle.write(buffer.getvalue())
    with atomic_writer(md_path) as handle:
        handle.write(zoo_markdown(rows, command))
    return csv_path, md_path


def read_zoo(path: Path) -> list[dict[str, str]]:
    with path.open(encoding="utf-8", newline="") as handle:
        return list(csv.DictReader(handle))


def scores(rows: Sequence[dict[str, str]]) -> dict[str, dict[str, tuple[int, list[str]]]]:
    """tool -> score -> (how many bugs it got right, the bugs it missed)."""
    board = {}
    for name, prefix, kinds in TOOLS:
        board[name] = {}
        for kind in kinds:
            right = [r["bug"] for r in rows if r[prefix + kind] == "True"]
            board[name][kind] = (len(right), [r["bug"] for r in rows if r["bug"] not in right])
    return board


def zoo_markdown(rows: Sequence[dict[str, str]], command: str) -> str:
    total = len(rows)
    board = scores(rows)
    lines = [
        "# The zoo: real GNN numerical bugs, and who catches them",
        "",
        f"`{command}`: {total} bugs from public trackers, each a small Keras GNN written as "
        "its users write it, with the data that triggers it and its ground truth (the stage "
        "where the first non-finite or wrong value arises, the op, the cause, the "
        "maintainers' fix): `stability/zoo/bugs/`. Each went through the harness (`run`), "
        "the doctor, and `model.fit` of the same model and data with Keras' "
        "`TerminateOnNaN` and with `tf.debugging.enable_check_numerics`.",
        "",
        "## The scoreboard",
        "",
        "| tool | detected | stage right | cause right | localized (stage and op) "
        "| fixed by the doctor |",
        "| --- | ---: | ---: | ---: | ---: | ---: |",
    ]
    for name, _, kinds in TOOLS:
        cells = []
        for kind in ("detected", "stage_right", "cause_right", "localized", "fixed"):
            if kind in kinds:
                right, _missed = board[name][kind]
                cells.append(f"{right}/{total} ({right / total:.0%})" if total else "0/0")
            else:
                cells.append("—")
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    lines += ["", "## Against the goals", ""]
    harness = board[TOOLS[0][0]]
    for kind, goal in GOALS.items():
        right, missed = harness[kind]
        rate = right / total if total else 0.0
        met = "met" if rate >= goal else "**missed**"
        named = f"; missed: {', '.join(f'`{m}`' for m in missed)}" if missed else ""
        lines.append(
            f"- {kind.replace('_', ' ')}: {rate:.0%} against the goal {goal:.0%}, {met}{named}."
        )
    lines += _doctor_goals(rows)
    lines += ["", "## What each tool misses", ""]
    for name, _, _kinds in TOOLS:
        missed = board[name]["detected"][1]
        lines.append(
            f"- {name}: "
            + (
                f"does not detect {', '.join(f'`{m}`' for m in missed)}"
                if missed
                else "detects every bug"
            )
            + "."
        )
    lines += ["", "## Without training: `stability check`", "", *_check_section(rows)]
    lines += ["", "## NanSentinel in fit against the harness", "", _agreement(rows)]
    lines += ["", "## Every bug", ""]
    lines += [
        "| bug | source | expected stage / cause / op | harness: stage / cause / op "
        "| doctor's fix | TerminateOnNaN | check_numerics | NanSentinel |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in rows:
        harness_cell = (
            f"{r['reported_stage']} / {r['reported_cause']} / `{r['reported_op']}`"
            if r["detected"] == "True"
            else "not detected"
        )
        tools = [_tool_cell(r, tool) for tool in TOOL_NAMES]
        lines.append(
            f"| `{r['bug']}` | [{r['source']}]({r['url']}) | {r['expected_stage']} / "
            f"{r['expected_cause']} / `{r['expected_op']}` | {harness_cell} | "
            f"{r['doctor_fix'] or 'none'} | " + " | ".join(tools) + " |"
        )
    lines += ["", "## The doctor's fix against the maintainers'", "", *_fix_section(rows)]
    lines += ["", "## Cost per step", "", *_cost(rows), ""]
    return "\n".join(lines)


def _rate_line(label: str, right: Sequence[str], among: Sequence[str], goal: float) -> str:
    rate = len(right) / len(among) if among else 0.0
    met = "met" if rate >= goal else "**missed**"
    missed = [name for name in among if name not in right]
    named = f"; missed: {', '.join(f'`{m}`' for m in missed)}" if missed else ""
    return (
        f"- {label}: {len(right)}/{len(among)} ({rate:.0%}) against the goal {goal:.0%}, "
        f"{met}{named}."
    )


def failing_rows(rows: Sequence[dict[str, str]]) -> list[dict[str, str]]:
    return [r for r in rows if r["detected"] == "True"]


def _doctor_goals(rows: Sequence[dict[str, str]]) -> list[str]:
    """The doctor's two goals: fixed among the bugs the harness detects in training, and a
    fix of the maintainers' class over the whole zoo."""
    failing = [r["bug"] for r in rows if r["detected"] == "True"]
    fixed = [r["bug"] for r in failing_rows(rows) if r["fixed"] == "True"]
    right = [r["bug"] for r in rows if r.get("fix_right") == "True"]
    silent = [r for r in rows if r["detected"] != "True"]
    repaired = [r["bug"] for r in silent if r.get("doctor_fix_from") == "check"]
    return [
        _rate_line("fixed among the bugs detected in training", fixed, failing, FIXED_FAILING_GOAL),
        f"- fixed by the doctor of the invariants the check finds broken, among the bugs "
        f"training does not detect: {len(repaired)}/{len(silent)}"
        + (
            f" ({', '.join(f'`{b}`' for b in repaired)}), each proved by checking the "
            "remedied model again, not by training"
            if repaired
            else ""
        )
        + ".",
        _rate_line(
            "fix right (the maintainers' class of fix, or a guard at the bug's op), over the "
            "whole zoo",
            right,
            [r["bug"] for r in rows],
            FIX_RIGHT_GOAL,
        ),
    ]


def _fix_section(rows: Sequence[dict[str, str]]) -> list[str]:
    """Each bug's maintainers' class of fix beside the doctor's, and the line it rewrites."""
    lines = [
        "| bug | maintainers' fix | doctor's fix | right | the fix as code |",
        "| --- | --- | --- | --- | --- |",
    ]
    for r in rows:
        doctor = f"`{r['doctor_fix']}` ({r['doctor_fix_class']})" if r["doctor_fix"] else "none"
        if r.get("doctor_fix_from") == "check":
            doctor += ", from the check"
        code = r.get("doctor_fix_code") or ""
        shown = f"`{code.replace('|', '/')}`" if code else ""
        lines.append(
            f"| `{r['bug']}` | {r.get('fix_class', '')} | {doctor} | "
            f"{'yes' if r.get('fix_right') == 'True' else 'no'} | {shown} |"
        )
    return lines


def _agreement(rows: Sequence[dict[str, str]]) -> str:
    """The sentence on how often ``NanSentinel`` in fit named what the harness's ``run``
    named, computed from the ``nan_sentinel_agrees`` column."""
    judged = [r for r in rows if r.get("nan_sentinel_agrees")]
    differ = [r["bug"] for r in judged if r["nan_sentinel_agrees"] != "True"]
    text = (
        f"On {len(judged) - len(differ)} of {len(judged)} bugs `NanSentinel` in `model.fit` "
        "names the same stage, op and cause as the harness's own run of the bug "
        "(`nan_sentinel_agrees`)"
    )
    if differ:
        return text + f"; it differs on {', '.join(f'`{b}`' for b in differ)}."
    return text + "."


def _tool_cell(row: dict[str, str], tool: str) -> str:
    if row[f"{tool}_detected"] != "True":
        return "not detected"
    op = f", `{row[f'{tool}_op']}`" if row[f"{tool}_op"] else ""
    return f"step {row[f'{tool}_step']}, {row[f'{tool}_stage']}{op}"


def _cost(rows: Sequence[dict[str, str]]) -> list[str]:
    """The median over the bugs of each tool's median step time in ``fit`` (steps after the
    first; a bug whose fit stopped at its first step has none), and its ratio to
    ``TerminateOnNaN``'s on the same bugs."""
    import statistics

    lines = [
        "Each tool's median time per step of `model.fit` on each bug (the steps after the "
        "first, which traces the step; a fit stopped at its first step has none), its "
        "median over the bugs, and its ratio to `TerminateOnNaN`'s over the bugs both have:",
        "",
        "| tool | bugs timed | median ms per step | ratio to TerminateOnNaN |",
        "| --- | ---: | ---: | ---: |",
    ]
    base = "terminate_on_nan_ms_per_step"
    for tool, name in TOOL_NAMES.items():
        column = f"{tool}_ms_per_step"
        timed = [r for r in rows if r[column]]
        both = [r for r in timed if r[base]]
        ratios = [float(r[column]) / float(r[base]) for r in both if float(r[base]) > 0]
        median = f"{statistics.median(float(r[column]) for r in timed):.3g}" if timed else ""
        ratio = f"{statistics.median(ratios):.2f}" if ratios else ""
        lines.append(f"| {name} | {len(timed)} | {median} | {ratio} |")
    return lines


def _check_section(rows: Sequence[dict[str, str]]) -> list[str]:
    """The check's score against its goals, and each bug's check, from the rows."""
    import statistics

    checked = [r for r in rows if r.get("check_own_data")]
    if not checked:
        return ["The check was not run on these bugs."]
    total = len(checked)
    lines = []
    names = {
        "check_own_data": "on the bug's own data",
        "check_generated": "from generated graphs alone",
    }
    for column, goal in CHECK_GOALS.items():
        hit = [r for r in checked if r[column] == "True"]
        missed = [r["bug"] for r in checked if r[column] != "True"]
        rate = len(hit) / total
        met = "met" if rate >= goal else "**missed**"
        suffix = column.removeprefix("check_").replace("own_data", "own")
        seconds = [float(r[f"check_seconds_{suffix}"]) for r in hit]
        median = ""
        if seconds:
            middle = statistics.median(seconds)
            fast = "met" if middle < CHECK_SECONDS_GOAL else "**missed**"
            median = (
                f"; median {middle:.1f} s until it detects a bug, against the goal of under "
                f"{CHECK_SECONDS_GOAL:.0f} s, {fast}"
            )
        named = f"; not detected: {', '.join(f'`{m}`' for m in missed)}" if missed else ""
        lines.append(
            f"- {names[column]}: detected {len(hit)}/{total} ({rate:.0%}) against the goal "
            f"{goal:.0%}, {met}{median}{named}."
        )
    silent = [r for r in checked if r["invariant"]]
    if silent:
        right = [r for r in silent if r["check_right"] == "True"]
        lines.append(
            f"- silent bugs: the check names the invariant the bug breaks on {len(right)} of "
            f"{len(silent)}."
        )
    right = [r for r in checked if r["check_right"] == "True"]
    lines.append(
        f"- every bug: the check names the bug (its invariant, or its stage and op) on "
        f"{len(right)} of {total}."
    )
    lines += [
        "",
        "| bug | invariant | own data: failing properties | generated: failing properties "
        "| names it | s (own / generated) |",
        "| --- | --- | --- | --- | --- | ---: |",
    ]
    for r in checked:
        own = r["check_properties_own"].replace(";", ", ") or "none"
        generated = r["check_properties_generated"].replace(";", ", ") or "none"
        lines.append(
            f"| `{r['bug']}` | {r['invariant'] or '—'} | {own} | {generated} | "
            f"{'yes' if r['check_right'] == 'True' else 'no'} | "
            f"{r['check_seconds_own']} / {r['check_seconds_generated']} |"
        )
    return lines
