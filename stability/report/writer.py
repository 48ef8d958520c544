"""Reports rendered from result rows: the CSV and the markdown summary per case.

Everything here reads a ``DataFrame`` with the ``RESULT_FIELDS`` columns, so a report can be
regenerated from a committed CSV alone (``python -m stability report reports/seed.csv``).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from stability.core.errors import NameNotFound, StabilityError
from stability.core.files import atomic_write_text
from stability.core.limits import exp_limits
from stability.core.results import (
    ADDED_HISTORY_FIELDS,
    ADDED_RESULT_FIELDS,
    HISTORY_FIELDS,
    RESULT_FIELDS,
    RunResult,
)
from stability.report.plots import write_plots
from stability.report.risk import MIN_TREND_EPOCHS, TREND_FRACTION, risk_table
from stability.report.summary import Setting, best_finite, settings

if TYPE_CHECKING:
    from stability.data.registry import Dataset


def results_frame(results: Sequence[RunResult]) -> pd.DataFrame:
    """The result rows as a ``DataFrame`` with the ``RESULT_FIELDS`` columns."""
    return pd.DataFrame([r.row() for r in results], columns=list(RESULT_FIELDS))


def read_results(path: str | Path) -> pd.DataFrame:
    """Read a results CSV, checking that it has the ``RESULT_FIELDS`` columns."""
    path = Path(path)
    if not path.exists():
        raise StabilityError(f"{path}: no such results file")
    return _read_table(path, RESULT_FIELDS, "results", optional=ADDED_RESULT_FIELDS)


def history_frame(results: Sequence[RunResult]) -> pd.DataFrame:
    """Every epoch of every run, with the ``HISTORY_FIELDS`` columns."""
    rows = [row for r in results for row in r.history_rows()]
    return pd.DataFrame(rows, columns=list(HISTORY_FIELDS))


def read_history(path: str | Path) -> pd.DataFrame | None:
    """The history CSV at ``path``, or None if there is none (a report without plots)."""
    path = Path(path)
    if not path.exists():
        return None
    return _read_table(path, HISTORY_FIELDS, "history", optional=ADDED_HISTORY_FIELDS)


def _read_table(
    path: Path, fields: Sequence[str], kind: str, optional: Sequence[str] = ()
) -> pd.DataFrame:
    """Read a CSV of ours, checking that it has ``fields``; one-line errors otherwise.

    ``optional`` columns were appended in a later version: a CSV written before lacks
    them, and gets them empty (NaN), which every reader treats as "not recorded".
    """
    try:
        # round_trip: every float back exactly as written. pandas' default parser may be a
        # unit in the last place off, and which way differs between pandas versions, so a
        # CSV rewritten from its own rows would change its last digits.
        frame = pd.read_csv(path, float_precision="round_trip")
    except (pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError) as exc:
        raise StabilityError(f"{path}: not a {kind} CSV ({exc})") from None
    for column in optional:
        if column not in frame.columns:
            frame[column] = np.nan
    missing = [c for c in fields if c not in frame.columns]
    if missing:
        raise StabilityError(f"{path}: not a {kind} CSV; missing columns {', '.join(missing)}")
    return frame


def summary_table(frame: pd.DataFrame) -> pd.DataFrame:
    """One row per (learning rate, batch size, variant): how often and when it hit a NaN."""
    best = best_finite(frame)
    rows = []
    for (lr, batch_size, variant), s in settings(frame):
        rows.append(
            {
                "variant": variant,
                "lr": f"{lr:g}",
                "batch": int(batch_size),
                "runs": s.runs,
                "NaN in": f"{s.nan_runs}/{s.runs}",
                "first NaN epoch, median [min-max]": _median_range(s.nan_epochs),
                "where": ", ".join(s.wheres()) or "-",
                "failing layer: op": _sites(s),
                "cause": _causes(s),
                "final MAE, median [IQR]": _median_iqr(s.final_maes),
                "final MAE / best finite": _relative(s, best),
                "best MAE, median": _median(s.rows["best_mae"]),
                "MAE before NaN, median": _median(s.rows["mae_before_nan"]),
                "max abs logit, median": _median(s.rows["max_abs_logit"], digits=1),
                "warning (finite runs)": _warnings(s),
                DIVERGED: _diverged(s),
                "NaN in input": f"{s.input_runs}/{s.runs}",
            }
        )
    table = pd.DataFrame(rows)
    if (frame["first_nan_where"] != "input").all():
        table = table.drop(columns="NaN in input")
    if (table["cause"] == "-").all():  # rows older than the column, or no failure
        table = table.drop(columns="cause")
    for column in ("failing layer: op", "warning (finite runs)", DIVERGED):
        if (table[column] == "-").all():
            table = table.drop(columns=column)
    # Settings that do not vary in the case are stated once above the table, not per row.
    for column in ("lr", "batch"):
        if table[column].nunique() == 1:
            table = table.drop(columns=column)
    return table


#: The summary column of the runs whose validation MAE diverged (``diverged_epoch``).
DIVERGED = "diverged (before any NaN)"


def _sites(s: Setting) -> str:
    """The failing runs' first-failure layer and op with their counts:
    ``message_passing_0: RealDiv (softmax_div) 3/3``."""
    sites = s.sites()
    if set(sites) <= {("-", "-")}:
        return "-"
    return ", ".join(f"{layer}: {op} {n}/{s.runs}" for (layer, op), n in sites.items())


def _diverged(s: Setting) -> str:
    """How many of the setting's runs diverged, and where: ``1/3: epoch 187 (seed 0)``."""
    runs = s.diverged
    if runs.empty:
        return "-"
    several = s.rows["dataset"].nunique() > 1
    data = {key: i for i, key in enumerate(s.rows["dataset"].unique(), start=1)}
    where = [
        f"epoch {int(row.diverged_epoch)} (seed {row.seed}"
        + (f", data {data[row.dataset]})" if several else ")")
        for row in runs.itertuples()
    ]
    return f"{len(runs)}/{s.runs}: " + ", ".join(where)


def _causes(s: Setting) -> str:
    """The failing runs' causes with their counts: ``forward underflow (0/0) 3/3``."""
    if "failure_cause" not in s.rows:
        return "-"
    found = s.rows.loc[s.training_nan, "failure_cause"].dropna()
    found = found[found.astype(str) != ""]
    counts = found.value_counts()
    return ", ".join(f"{cause} {n}/{s.runs}" for cause, n in sorted(counts.items())) or "-"


def _warnings(s: Setting) -> str:
    """How many of the setting's finite runs carry a warning, and the first one's text."""
    warned = s.warnings
    if warned.empty:
        return "-"
    return f"{len(warned)}/{s.runs}: {warned.iloc[0]}"


def _relative(s: Setting, best: tuple[str, float] | None) -> str:
    if best is None or not len(s.final_maes) or best[1] <= 0:
        return "-"
    return f"{s.final_mae / best[1]:.2f}x"


def _median_iqr(values: pd.Series) -> str:
    values = values.dropna()
    if not len(values):
        return "-"
    q1, q2, q3 = values.quantile([0.25, 0.5, 0.75])
    return f"{q2:.3f} [{q1:.3f}-{q3:.3f}]"


def markdown_report(
    frame: pd.DataFrame,
    case: str,
    description: str = "",
    history: pd.DataFrame | None = None,
    datasets: Sequence[Dataset] = (),
) -> str:
    """The case's markdown report; with ``history``, also the risk lines and the plots;
    with the case's ``datasets``, what they held (``data_facts``)."""
    first = frame.iloc[0]
    facts = data_facts(datasets)
    settings = pd.DataFrame(
        {
            "setting": [
                "data set",
                *facts,
                "epochs (budget)",
                "dtype",
                "seeds",
                "batch sizes",
                "learning rates",
                "TensorFlow",
                "environment",
            ],
            "value": [
                # A case with num_datasets > 1 trains on several; name each of them.
                "<br>".join(f"`{key}`" for key in frame["dataset"].unique()),
                *facts.values(),
                str(int(first["epochs"])),
                str(first["dtype"]),
                ", ".join(str(s) for s in sorted(frame["seed"].unique())),
                ", ".join(str(b) for b in sorted(frame["batch_size"].unique())),
                ", ".join(f"{x:g}" for x in sorted(frame["learning_rate"].unique())),
                str(first["tf_version"]),
                _environments(frame),
            ],
        }
    )
    variants = pd.DataFrame(
        [{"variant": v, "what it changes": _describe(v)} for v in frame["variant"].unique()]
    )
    table = summary_table(frame)
    parts = [
        f"# Case `{case}`",
        description.strip(),
        "Generated by `stability` from `" + f"{case}.csv`" + " (one row per training run).",
        "## Settings",
        settings.to_markdown(index=False),
        "## Variants",
        variants.to_markdown(index=False),
        "## Results",
        _reference_line(frame),
        table.to_markdown(index=False),
        *(_history_sections(frame, history, case) if history is not None else []),
        _reading_guide(frame, table),
    ]
    return "\n\n".join(p for p in parts if p) + "\n"


def data_facts(datasets: Sequence[Dataset]) -> dict[str, str]:
    """What the case's data sets held, as Settings rows: the graphs that trained and
    validated, the edges and the distances they carry (a cutoff drops every pair beyond
    it), and the nodes no edge enters. One value per data set, joined like the data set
    row; empty without data sets (a report rendered from a CSV alone)."""
    if not datasets:
        return {}
    rows = {
        "graphs (train / validation)": [
            f"{d.num_train_graphs} / {d.num_val_graphs}" for d in datasets
        ],
        "edges (distances used)": [_edges(d) for d in datasets],
        "nodes without incoming edges": [
            f"{d.isolated_nodes} ({d.graphs_without_edges} graph(s) without any edge)"
            for d in datasets
        ],
    }
    return {name: _joined(values) for name, values in rows.items()}


def _edges(data: Dataset) -> str:
    if not data.num_edges:
        return "0 edges"
    text = f"{data.num_edges} edges, distances {data.edge_min:.3g} to {data.edge_max:.3g}"
    if data.cutoff is not None:
        text += f"; cutoff {data.cutoff:g}: a pair farther apart has no edge"
    return text


def _joined(values: list[str]) -> str:
    """One value when every data set gives it, else each in the data set row's order."""
    return values[0] if len(set(values)) == 1 else "<br>".join(values)


def _environments(frame: pd.DataFrame) -> str:
    """The environments the rows were made in (libraries, thread layout, CPU), with how
    many runs each; rows older than the column have none recorded."""
    column = frame["environment"].fillna("") if "environment" in frame else pd.Series([""])
    counts = column.value_counts(sort=False)
    if len(counts) == 1:
        (env,) = counts.index
        return env or "not recorded (rows older than the environment column)"
    return "<br>".join(
        f"{n} run(s): {env or 'not recorded'}" for env, n in sorted(counts.items(), key=str)
    )


def _reference_line(frame: pd.DataFrame) -> str:
    best = best_finite(frame)
    if best is None:
        return "No variant stayed finite in every run: no reference for relative MAE."
    return (
        f"MAE is relative to `{best[0]}` (median final MAE {best[1]:.3f}), the best variant "
        "none of whose runs hit a NaN."
    )


def _history_sections(frame: pd.DataFrame, history: pd.DataFrame, case: str) -> list[str]:
    dtype = str(frame["dtype"].iloc[0])
    limits = exp_limits(dtype)
    return [
        "## Risk",
        (
            f"Growth of max |attention logit| per epoch: a least-squares line over the last "
            f"{TREND_FRACTION:.0%} of each run's epochs, median over the runs. The history keeps "
            f"max |logit|, so its sign is lost; the line is the nearer of `exp`'s two "
            f"{limits.dtype} limits: overflow above +{limits.overflow:.2f} and flush-to-zero "
            f"underflow below -{limits.underflow:.2f} (when every logit into a node is below "
            "it, the naive softmax computes 0/0). For runs that stayed finite, the epoch at "
            "which the trend would reach the line; not for runs of fewer than "
            f"{MIN_TREND_EPOCHS} epochs, too few points to extrapolate from."
        ),
        risk_table(frame, history).to_markdown(index=False),
        "## Plots",
        f"![max |attention logit| per epoch]({case}.logits.png)",
        f"![validation MAE per epoch]({case}.mae.png)",
        *(
            [f"![max |raw gradient| per epoch]({case}.grads.png)"]
            if "max_abs_grad" in history and history["max_abs_grad"].notna().any()
            else []
        ),
    ]


_READING_GUIDE = """\
## How to read this

- **NaN in k/n**: in k of the n runs (seeds) some value of the training step was not finite
  (NaN or Inf) within the epoch budget. The run stops there.
- **first NaN epoch**: the epoch (from 1) of the first non-finite value, median over the
  runs that hit one, with the range. `-` means no run hit one.
- **where**: the first stage of the step that was not finite: `forward` (predictions,
  attention logits or attention weights), `loss`, `gradient`, `weights` (after the
  update) or `validation`. `(normalization)` after a stage means every value was finite
  but the attention weights into some node did not sum to 1; `(masked gradient)` means the
  gradient transform turned a non-finite gradient finite.
- **cause** (only for rows that have it): what kind of failure each failing run's first
  one was, with counts: `forward overflow`, `forward underflow (0/0)`, `forward`, `loss`,
  `gradient explosion`, `non-finite gradient op`, `optimizer`, or a silent kind; the rule
  that decides it is in docs/findings.md, "Reading the failure cause". Clipping answers a
  gradient explosion, not a forward overflow or underflow.
- **final MAE**: validation MAE in the target's own units after the last epoch, for runs that
  stayed finite, median with the interquartile range. **/ best finite**: that median divided
  by the best median of a variant none of whose runs hit a NaN. **best MAE**: the lowest
  validation MAE of the epochs a user could have kept, those before any failure (none for
  a run that failed in its first epoch). **MAE before NaN**: the validation MAE after the
  last whole epoch before the NaN.
- **max abs logit**: the largest |attention logit| seen; {limits}.
- **warning (finite runs)** (only when some finite run has one): how many of the runs that
  stayed finite came close to `exp`'s limits or diverged, and the first one's warning, which
  names the line, the value and the margin (or, under XLA, the region where its softmax
  gradient is finite but wrong), or the divergence.
- **NaN in input** (only when some run had it): runs whose data held NaN or Inf, allowed by
  the case's `allow_nonfinite_input`; they were not trained and do not count under NaN in.
"""


#: Guide lines of the columns a table shows only when some row fills them.
_OPTIONAL_GUIDE = {
    "failing layer: op": (
        "- **failing layer: op**: the Keras layer path and the op of each failing run's "
        "first non-finite value (`first_nan_layer`, `first_nan_op`), with counts."
    ),
    DIVERGED: (
        "- **{diverged}**: runs whose validation MAE, in the epochs before any failure, went "
        "above {factor:g}x the best validation MAE of the epochs before it, with the first "
        "such epoch (`diverged_epoch`); the CSV's `warning` names that MAE and the best "
        "before it. A warning, not a NaN: **NaN in** and the claims do not count it."
    ),
}


def _reading_guide(frame: pd.DataFrame, table: pd.DataFrame) -> str:
    """The column guide, with ``exp``'s limits for each dtype the case's rows were run in,
    and the lines of the optional columns ``table`` shows."""
    guide = _READING_GUIDE
    shown = [column for column in _OPTIONAL_GUIDE if column in table.columns]
    if shown:
        # Imported here: run_summary brings TensorFlow (as _describe's variants do).
        from stability.train.run_summary import DIVERGENCE_FACTOR

        lines = [
            _OPTIONAL_GUIDE[c].format(diverged=DIVERGED, factor=DIVERGENCE_FACTOR) for c in shown
        ]
        guide = guide.rstrip("\n") + "\n" + "\n".join(lines) + "\n"
    lines = []
    for dtype in sorted(frame["dtype"].astype(str).unique()):
        limits = exp_limits(dtype)
        lines.append(
            f"`exp` overflows {dtype} above +{limits.overflow:.2f} and, with denormals flushed "
            f"to zero, returns 0 below -{limits.underflow:.2f}"
        )
    return guide.replace("{limits}", "; ".join(lines))


def _describe(variant: str) -> str:
    # Imported here: the variants bring TensorFlow, which `compare` (CSV only) never needs.
    from stability.model.variants import get_variant

    try:
        return get_variant(variant).description
    except NameNotFound:
        return "(not registered in this session)"


def _median(values: pd.Series, digits: int = 3) -> str:
    values = values.dropna()
    return f"{values.median():.{digits}f}" if len(values) else "-"


def _median_range(values: pd.Series) -> str:
    if not len(values):
        return "-"
    return f"{np.median(values):g} [{values.min():g}-{values.max():g}]"


def write_reports(
    frame: pd.DataFrame,
    out_dir: Path,
    case: str,
    description: str = "",
    history: pd.DataFrame | None = None,
    datasets: Sequence[Dataset] = (),
) -> Path:
    """Write ``<case>.md`` (and, with ``history``, its PNGs) into ``out_dir``; return the
    markdown's path. ``datasets``, the case's, add what they held to the Settings."""
    out_dir.mkdir(parents=True, exist_ok=True)
    if history is not None and not history.empty:
        nan = frame[frame["first_nan_epoch"].notna()]
        nan_runs = frozenset(
            nan[["learning_rate", "batch_size", "variant", "seed", "dataset"]].itertuples(
                index=False, name=None
            )
        )
        write_plots(history, out_dir, case, str(frame["dtype"].iloc[0]), nan_runs)
    else:
        history = None
    path = out_dir / f"{case}.md"
    atomic_write_text(path, markdown_report(frame, case, description, history, datasets))
    return path
