"""A hunt's report: ``<name>.hunt.csv`` (one row per training) and ``<name>.hunt.md``.

Every sentence of the markdown is computed from the trainings: what failed, where, how
many trainings and seconds it took, whether ``run`` reproduced it, and what the found data
looks like beside the case's own.
"""

from __future__ import annotations

import math
from pathlib import Path

import pandas as pd

from stability.core.files import atomic_write_text
from stability.core.results import FIRST_NAN_FIELDS, RunResult
from stability.explore.found_case import found_name
from stability.explore.hunt import Hunt, Training

#: The columns of ``<name>.hunt.csv``, in order.
HUNT_FIELDS = (
    "training",
    "strategy",
    "move",
    "failed",
    *FIRST_NAN_FIELDS,
    "failure_cause",
    "limit",
    "margin",
    "margin_epoch",
    "final_mae",
    "seconds",
    "graphs",
    "edges",
    "distance_min",
    "distance_median",
    "distance_max",
    "share_near_top",
    "nearest_median",
    "nearest_gap_median",
    "in_degree_mean",
    "in_degree_max",
    "isolated_nodes",
    "graphs_without_edges",
    "duplicate_edges",
)

#: How the statistics read in the markdown's data table.
_STATISTICS = (
    ("graphs", "graphs"),
    ("edges", "edges"),
    ("distance_min", "distance, min"),
    ("distance_median", "distance, median"),
    ("distance_max", "distance, max"),
    ("share_near_top", "share of distances in the top 5% of the range"),
    ("nearest_median", "a node's nearest incoming distance, median"),
    ("nearest_gap_median", "gap from a node's nearest to its second-nearest, median"),
    ("in_degree_mean", "in-degree, mean (nodes with an incoming edge)"),
    ("in_degree_max", "in-degree, max"),
    ("isolated_nodes", "nodes without an incoming edge"),
    ("graphs_without_edges", "graphs without edges"),
    ("duplicate_edges", "duplicate edges"),
)


def hunt_frame(hunt: Hunt) -> pd.DataFrame:
    """One row per training, columns ``HUNT_FIELDS``."""
    rows = []
    for t in hunt.trainings:
        r = t.result
        rows.append(
            {
                "training": t.index,
                "strategy": hunt.strategy,
                "move": t.move,
                "failed": t.failed,
                "first_nan_epoch": r.first_nan_epoch,
                "first_nan_step": r.first_nan_step,
                "first_nan_where": r.first_nan_where,
                "first_nan_layer": r.first_nan_layer,
                "first_nan_op": r.first_nan_op,
                "failure_cause": r.failure_cause,
                "limit": t.margin.limit,
                "margin": t.margin.margin,
                "margin_epoch": t.margin.epoch,
                "final_mae": r.final_mae,
                "seconds": round(t.seconds, 3),
                **t.statistics,
            }
        )
    return pd.DataFrame(rows, columns=list(HUNT_FIELDS))


def write_hunt_report(
    hunt: Hunt, out: Path, case_path: Path | None, reproduced: RunResult | None
) -> Path:
    """Write ``<name>.hunt.csv`` and ``<name>.hunt.md`` into ``out``; returns the markdown."""
    name = found_name(hunt)
    atomic_write_text(out / f"{name}.hunt.csv", hunt_frame(hunt).to_csv(index=False))
    path = out / f"{name}.hunt.md"
    atomic_write_text(path, hunt_markdown(hunt, case_path, reproduced))
    return path


def hunt_markdown(hunt: Hunt, case_path: Path | None, reproduced: RunResult | None) -> str:
    space, best = hunt.space, hunt.best
    assert best is not None
    name = found_name(hunt)
    lines = [
        f"# Hunt `{name}`",
        "",
        f"A {hunt.strategy} search of case `{hunt.case.name}`'s data space for data on which "
        f"`{hunt.variant}` fails: edge distances in [{space.min_distance:g}, "
        f"{space.max_distance:g}], {space.num_graphs} graphs of {space.min_nodes}-"
        f"{space.max_nodes} nodes, targets by the {space.attend}-neighbour rule; each training "
        f"runs the case's settings (seed {hunt.config.seed}, batch {hunt.config.batch_size}, "
        f"learning rate {hunt.config.learning_rate:g}, {hunt.config.epochs} epochs, "
        f"{hunt.config.dtype}).",
        "",
        "## Outcome",
        "",
        _outcome(hunt),
    ]
    if case_path is not None:
        lines += ["", _reproduction(best, case_path, reproduced)]
    lines += ["", "## The data", "", *_data_table(hunt), "", "## Trainings", ""]
    lines += _trainings_table(hunt)
    return "\n".join(lines) + "\n"


def _outcome(hunt: Hunt) -> str:
    best = hunt.best
    assert best is not None
    total = sum(t.seconds for t in hunt.trainings)
    count = len(hunt.trainings)
    spent = f"{count} training{'' if count == 1 else 's'}, {total:.1f} s"
    if not best.failed:
        why = (
            " It stopped early: no limit's gradient moves any distance."
            if hunt.stopped == "stuck"
            else ""
        )
        return (
            f"No training failed in {spent}. The closest was training {best.index}: "
            f"{best.margin.describe()}.{why}"
        )
    r, first = best.result, hunt.trainings_to_failure()
    seconds = hunt.seconds_to_failure() or 0.0
    text = (
        f"The first failure came at training {first} ({seconds:.1f} s). "
        f"The earliest one, of training {best.index}: `{hunt.variant}` fails at epoch "
        f"{r.first_nan_epoch}, step {r.first_nan_step}, {_site(r)}, cause "
        f"`{r.failure_cause}`. The hunt took {spent}."
    )
    start = hunt.trainings[0]
    if start.failed and best.index != start.index:
        text += f" The case's own data failed at epoch {start.result.first_nan_epoch}."
    elif not start.failed:
        text += f" The case's own data stayed finite ({start.margin.describe()})."
    return text


def _site(r: RunResult) -> str:
    parts = [p for p in (r.first_nan_where, r.first_nan_layer, r.first_nan_op) if p]
    return "in " + " / ".join(f"`{p}`" for p in parts) if parts else "site not named"


def _reproduction(best: Training, case_path: Path, reproduced: RunResult | None) -> str:
    command = f"`python -m stability run {case_path.name}`"
    if reproduced is None:
        return f"{command} trains the found data (not rerun here: --no-reproduce)."
    same = (
        reproduced.first_nan_epoch == best.result.first_nan_epoch
        and reproduced.first_nan_step == best.result.first_nan_step
        and reproduced.failure_cause == best.result.failure_cause
    )
    got = (
        f"epoch {reproduced.first_nan_epoch}, step {reproduced.first_nan_step}, "
        f"cause `{reproduced.failure_cause}`"
        if reproduced.hit_nan
        else "no failure"
    )
    verdict = "reproduces it" if same else "does NOT reproduce it"
    return f"{command} {verdict}: {got}."


def _data_table(hunt: Hunt) -> list[str]:
    best, start = hunt.best, hunt.trainings[0]
    assert best is not None
    lines = [
        f"| statistic | the case's data (training 1) | found (training {best.index}) |",
        "| --- | ---: | ---: |",
    ]
    for key, label in _STATISTICS:
        lines.append(f"| {label} | {_num(start.statistics[key])} | {_num(best.statistics[key])} |")
    return lines


def _trainings_table(hunt: Hunt) -> list[str]:
    lines = [
        "| training | move | outcome | closest limit | margin (e-folds) | seconds |",
        "| ---: | --- | --- | --- | ---: | ---: |",
    ]
    for t in hunt.trainings:
        r = t.result
        outcome = (
            f"fails at epoch {r.first_nan_epoch} ({r.failure_cause})" if t.failed else "finite"
        )
        when = "before training" if t.margin.epoch == 0 else f"epoch {t.margin.epoch}"
        limit = f"{t.margin.limit} ({when})" if math.isfinite(t.margin.margin) else "-"
        lines.append(
            f"| {t.index} | {t.move} | {outcome} | {limit} | {_num(t.margin.margin)} | "
            f"{t.seconds:.1f} |"
        )
    return lines


def _num(value: float) -> str:
    if isinstance(value, float) and not math.isfinite(value):
        return "-"
    if isinstance(value, int) or float(value).is_integer():
        return str(int(value))
    return f"{value:.3g}"
