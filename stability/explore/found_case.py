"""What a hunt found, as an ordinary case: ``<name>.toml`` beside ``<name>.npz``.

The case trains the hunted variant with the hunted case's settings (its first learning
rate, batch size and the hunt's seed) on the found graphs, read by the ``npz`` data set,
which splits them as the hunt's own trainings did (``HuntSpace.dataset_of``); so
``python -m stability run <name>.toml`` trains exactly what the hunt trained.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from stability.explore.hunt import Hunt
from stability.sweep.case_file import write_data_case


def found_name(hunt: Hunt) -> str:
    """``<case>_hunt_<variant>``: the found case's name, and its files' stem."""
    return f"{hunt.case.name}_hunt_{hunt.variant}"


def write_found_case(hunt: Hunt, out: Path, plugins: Sequence[str] = ()) -> Path:
    """Write the hunt's closest data (the found data, if it failed) and a case that trains
    it; ``plugins`` are written as given (make paths absolute first). Returns the case path."""
    best = hunt.best
    assert best is not None
    outcome = (
        f"fails at epoch {best.result.first_nan_epoch} ({best.result.failure_cause})"
        if best.failed
        else f"stays finite; closest: {best.margin.describe()}"
    )
    comment = [
        f"Written by `python -m stability hunt` from case {hunt.case.name!r}: the data of its",
        f"training {best.index} of {len(hunt.trainings)}, on which {hunt.variant} {outcome}.",
    ]
    return write_data_case(
        hunt.best_graphs,
        out / f"{found_name(hunt)}.toml",
        comment,
        description(hunt, outcome),
        hunt.variant,
        hunt.config,
        hunt.space.val_fraction,
        plugins,
    )


def description(hunt: Hunt, outcome: str) -> str:
    space = hunt.space
    return (
        f"{hunt.variant} {outcome} on {len(hunt.best_graphs)} graphs found by a "
        f"{hunt.strategy} hunt of case {hunt.case.name}'s data space (edge distances in "
        f"[{space.min_distance:g}, {space.max_distance:g}], {space.min_nodes}-{space.max_nodes} "
        f"nodes, targets by the {space.attend}-neighbour rule)."
    )
