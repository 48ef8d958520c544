"""What a hunt found, as an ordinary case: ``<name>.toml`` beside ``<name>.npz``.

The case trains the hunted variant with the hunted case's settings (its first learning
rate, batch size and the hunt's seed) on the found graphs, read by the ``npz`` data set,
which splits them as the hunt's own trainings did (``HuntSpace.dataset_of``); so
``python -m stability run <name>.toml`` trains exactly what the hunt trained.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

from stability.core.files import atomic_write_text
from stability.data.npz import save_graphs
from stability.explore.hunt import Hunt


def found_name(hunt: Hunt) -> str:
    """``<case>_hunt_<variant>``: the found case's name, and its files' stem."""
    return f"{hunt.case.name}_hunt_{hunt.variant}"


def write_found_case(hunt: Hunt, out: Path, plugins: Sequence[str] = ()) -> Path:
    """Write the hunt's closest data (the found data, if it failed) and a case that trains
    it; ``plugins`` are written as given (make paths absolute first). Returns the case path."""
    name = found_name(hunt)
    out.mkdir(parents=True, exist_ok=True)
    data = save_graphs(hunt.best_graphs, out / f"{name}.npz")
    path = out / f"{name}.toml"
    atomic_write_text(path, case_text(hunt, data.name, plugins))
    return path


def case_text(hunt: Hunt, data_file: str, plugins: Sequence[str] = ()) -> str:
    """The TOML of the found case (JSON strings and lists are valid TOML)."""
    cfg, best = hunt.config, hunt.best
    assert best is not None
    outcome = (
        f"fails at epoch {best.result.first_nan_epoch} ({best.result.failure_cause})"
        if best.failed
        else f"stays finite; closest: {best.margin.describe()}"
    )
    lines = [
        f"# Written by `python -m stability hunt` from case {hunt.case.name!r}: the data of its",
        f"# training {best.index} of {len(hunt.trainings)}, on which {hunt.variant} {outcome}.",
        f"description = {json.dumps(description(hunt, outcome))}",
        f"variants = [{json.dumps(hunt.variant)}]",
        f"seeds = [{cfg.seed}]",
        f"batch_sizes = [{cfg.batch_size}]",
        f"learning_rates = [{cfg.learning_rate!r}]",
        f"epochs = {cfg.epochs}",
        f"dtype = {json.dumps(cfg.dtype)}",
    ]
    if cfg.jit_compile:
        lines.append("jit_compile = true")
    if plugins:
        lines.append(f"plugins = {json.dumps(list(plugins))}")
    lines += [
        "",
        "[model]",
        f"hidden = {cfg.hidden}",
        f"num_layers = {cfg.num_layers}",
        "",
        "[dataset]",
        'name = "npz"',
        f"path = {json.dumps(data_file)}",
        "seed = 0",
        f"val_fraction = {hunt.space.val_fraction!r}",
        "",
    ]
    return "\n".join(lines)


def description(hunt: Hunt, outcome: str) -> str:
    space = hunt.space
    return (
        f"{hunt.variant} {outcome} on {len(hunt.best_graphs)} graphs found by a "
        f"{hunt.strategy} hunt of case {hunt.case.name}'s data space (edge distances in "
        f"[{space.min_distance:g}, {space.max_distance:g}], {space.min_nodes}-{space.max_nodes} "
        f"nodes, targets by the {space.attend}-neighbour rule)."
    )
