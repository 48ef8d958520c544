"""The data the doctor retrains its fixes on beyond the case's own: the hunt's soonest
search of the original variant (``stability.doctor.run.Push``).

The doctor and the hunt are features, and a feature never imports another: they meet here,
at the command line, as the zoo and the doctor meet in ``commands/zoo.py``.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the command line's import stays light: the doctor loads TensorFlow
    from stability.doctor.run import Push, Pushed
    from stability.sweep.cases import Case

#: The trainings the hunt spends pushing the original variant's data toward an earlier
#: failure (``doctor --push-budget``).
PUSH_BUDGET = 3


def hunt_push(budget: int = PUSH_BUDGET) -> Push:
    """A ``Push`` that hunts, in at most ``budget`` trainings, the data on which the
    original variant fails soonest (``hunt(..., soonest=True)``) and writes it beside the
    doctor's runs, as ``<case>.pushed.npz``."""

    def push(case: Case, variant: str, folder: Path) -> Pushed:
        from stability.data.npz import save_graphs
        from stability.doctor.run import Pushed
        from stability.explore.hunt import hunt
        from stability.explore.hunt_space import SPACES

        if case.dataset not in SPACES:
            return Pushed(
                None,
                f"the hunt moves the data of the {' and '.join(SPACES)} data sets only, "
                f"and this case trains on {case.dataset!r}",
            )
        if case.edge_transform != "none" or case.self_loops:
            return Pushed(None, "the hunt moves raw distances, and this case transforms them")
        found = hunt(case, variant, budget=budget, soonest=True)
        own, best = found.trainings[0], found.best
        if best is None or not best.failed or best.index == own.index:
            count = len(found.trainings)
            return Pushed(
                None,
                f"in {count} training{'s' if count != 1 else ''} the hunt found no data on "
                f"which {variant} fails sooner than on the case's own",
            )
        path = save_graphs(found.best_graphs, folder / f"{case.name}.pushed.npz")
        return Pushed(path, _describe(found, own, best), found.space.val_fraction)

    return push


def _describe(found, own, best) -> str:
    """The pushed data in words: where the original fails on it and on the case's own."""

    def when(training) -> str:
        r = training.result
        return f"epoch {r.first_nan_epoch} step {r.first_nan_step}" if training.failed else "never"

    stats = best.statistics
    return (
        f"data the hunt pushed toward the failure in {len(found.trainings)} trainings "
        f"(largest distance {stats['distance_max']:.4g}, median "
        f"{stats['distance_median']:.4g}), on which {found.variant} fails at {when(best)} "
        f"({when(own)} on the case's own)"
    )
