"""A case file written by the harness for graphs it found: ``<name>.toml`` beside
``<name>.npz``, so that ``python -m stability run <name>.toml`` trains one variant on them.

The hunt writes the data it hunted down; the check writes its counterexamples. The case
reads the graphs with the ``npz`` data set, split by ``val_fraction`` (its last graphs
validate), and trains with one run's settings (``TrainConfig``).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

from stability.core.files import atomic_write_text
from stability.core.plugins import is_path
from stability.data.graphs import Graph
from stability.data.npz import save_graphs
from stability.sweep.cases import Case
from stability.train.config import TrainConfig


def write_data_case(
    graphs: Sequence[Graph],
    path: Path,
    comment: Sequence[str],
    description: str,
    variant: str,
    config: TrainConfig,
    val_fraction: float,
    plugins: Sequence[str] = (),
) -> Path:
    """Write ``graphs`` to ``path`` with suffix ``.npz`` and the case to ``path`` (a
    ``.toml``); ``comment`` lines open the file. Returns ``path``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    data = save_graphs(graphs, path.with_suffix(".npz"))
    text = data_case_text(comment, description, variant, config, data.name, val_fraction, plugins)
    atomic_write_text(path, text)
    return path


def data_case_text(
    comment: Sequence[str],
    description: str,
    variant: str,
    config: TrainConfig,
    data_file: str,
    val_fraction: float,
    plugins: Sequence[str] = (),
) -> str:
    """The case's TOML (JSON strings and lists are valid TOML)."""
    lines = [
        *(f"# {line}" for line in comment),
        f"description = {json.dumps(description)}",
        f"variants = [{json.dumps(variant)}]",
        f"seeds = [{config.seed}]",
        f"batch_sizes = [{config.batch_size}]",
        f"learning_rates = [{config.learning_rate!r}]",
        f"epochs = {config.epochs}",
        f"dtype = {json.dumps(config.dtype)}",
    ]
    if config.jit_compile:
        lines.append("jit_compile = true")
    if plugins:
        lines.append(f"plugins = {json.dumps(list(plugins))}")
    lines += [
        "",
        "[model]",
        f"hidden = {config.hidden}",
        f"num_layers = {config.num_layers}",
        "",
        "[dataset]",
        'name = "npz"',
        f"path = {json.dumps(data_file)}",
        "seed = 0",
        f"val_fraction = {val_fraction!r}",
        "",
    ]
    return "\n".join(lines)


def absolute_plugins(case: Case, case_path: Path, plugins: Sequence[str]) -> list[str]:
    """The plugins a written case names: ``case``'s (a path read from its file's folder)
    and the command line's (a path read from the working folder), paths made absolute, so
    the written case loads them from wherever it is."""
    return [str((case_path.parent / p).resolve()) if is_path(p) else p for p in case.plugins] + [
        str(Path(p).resolve()) if is_path(p) else p for p in plugins
    ]
