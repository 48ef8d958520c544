"""How the doctor pushes a fix beyond the case's data: the hunt, climbing the remedied
variant's own margins toward its limits (``stability.doctor.run.Push``).

The doctor and the hunt are features, and a feature never imports another: they meet here,
at the command line, as the zoo and the doctor meet in ``commands/zoo.py``.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the command line's import stays light: the doctor loads TensorFlow
    from stability.doctor.run import Push, Pushed
    from stability.explore.hunt import Hunt
    from stability.sweep.cases import Case

#: The trainings the hunt spends on each fix it pushes (``doctor --push-budget``); the
#: first trains the case's own data, to read how near the fix comes to its limits.
PUSH_BUDGET = 3


def hunt_push(budget: int = PUSH_BUDGET, plugins: Sequence[str] = ()) -> Push:
    """A ``Push`` that hunts, in at most ``budget`` trainings, data on which the fix's
    variant fails (``hunt``, directed) and, when it found some, writes it into the doctor's
    folder as the hunt command does: a case that trains it (naming ``plugins``, absolute
    paths), its ``.npz`` and the hunt's report."""

    def push(case: Case, folder: Path) -> Pushed:
        from stability.doctor.run import Pushed
        from stability.explore.hunt import hunt
        from stability.explore.hunt_space import SPACES
        from stability.explore.run import write_hunt

        if case.dataset not in SPACES:
            return Pushed(
                False,
                f"not pushed: the hunt moves the data of the {' and '.join(SPACES)} data "
                f"sets only, and this case trains on {case.dataset!r}",
                tried=False,
            )
        if case.edge_transform != "none" or case.self_loops:
            return Pushed(
                False,
                "not pushed: the hunt moves raw distances, and this fix transforms them",
                tried=False,
            )
        found = hunt(case, case.variants[0], budget=budget)
        if not found.found:
            return Pushed(False, f"held {_where(found)}")
        path, _ = write_hunt(found, folder, plugins, reproduce=False)
        r = found.best.result
        return Pushed(
            True,
            f"failed {_where(found)}",
            path,
            stage=r.first_nan_where,
            layer=r.first_nan_layer,
            cause=r.failure_cause,
        )

    return push


def _where(found: Hunt) -> str:
    """Where the hunt's closest training came, and on what data, in words."""
    best, count = found.best, len(found.trainings)
    stats = best.statistics
    data = f"largest distance {stats['distance_max']:.4g}, median {stats['distance_median']:.4g}"
    trainings = f"{count} training{'s' if count != 1 else ''}"
    if best.failed:
        r = best.result
        return (
            f"at epoch {r.first_nan_epoch} ({r.failure_cause}) on the data of the hunt's "
            f"training {best.index} of {trainings} ({data})"
        )
    closest = f"closest: {best.margin.describe()} ({data})"
    if found.stopped == "stuck":
        return f"after {trainings}, when the hunt had no move left toward a limit; {closest}"
    return f"through the hunt's {trainings}; {closest}"
