"""``edge_continuity``: a prediction moves by a bounded amount when one edge distance moves
by a small step, inside the case's distances and across a declared cutoff.

Inside: one edge's distance is swept over ``GRID`` points from the smallest to the largest
distance (one batch of copies of the graph), and the interval where the prediction moves
most is halved, keeping the half that moves more, until it is ``ULPS`` units in the last
place of the distance wide. A continuous prediction's move shrinks with the interval (by
2**-steps, about 1e-4 after 14 halvings); a jump does not: the property fails when the last
interval still moves the prediction by more than half the first interval's move and by more
than the agreement tolerance (``stability.check.tolerance``). A jump keeps at least its own
size in the half that holds it; so the halving stops, continuous, as soon as the kept half
moves by half the first move or less (a smooth prediction gets there in one or two halvings).

Across a cutoff: a model that declares a cutoff (``[check] cutoff`` in the case) promises
that an edge's message vanishes there, since a data set builder drops every pair beyond it:
a molecule's energy must not jump when an atom crosses the cutoff. The prediction with an
edge ``ULPS`` units below the cutoff must equal the prediction without that edge.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

import numpy as np

from stability.check.properties import MODEL_ERRORS, Predicate, Violation
from stability.check.subject import Subject
from stability.check.tolerance import agreement_tolerance, compute_dtype
from stability.data.graphs import Graph

#: Points of the sweep over the distances.
GRID = 17

#: The narrowest interval, in units in the last place of the distance in the model's dtype.
ULPS = 64

#: At most this many edges of a graph, and graphs of a batch, are swept.
MAX_EDGES = 2
MAX_GRAPHS = 2

#: Halvings at most (a float64 distance would allow ~40; 24 shrink any slope enough).
MAX_HALVINGS = 24


def edge_continuity(low: float, high: float, cutoff: float | None = None) -> Predicate:
    """The property for distances in ``[low, high]`` and, if declared, ``cutoff``."""

    def predicate(subject: Subject, graphs: Sequence[Graph]) -> Violation | None:
        for graph in graphs[:MAX_GRAPHS]:
            for edge in range(min(graph.num_edges, MAX_EDGES)):
                try:
                    found = _jump_inside(subject, graph, edge, low, high)
                    if found is None and cutoff is not None:
                        found = _jump_at_cutoff(subject, graph, edge, cutoff)
                except MODEL_ERRORS:
                    return None
                if found is not None:
                    return found
        return None

    return predicate


def _predict_at(subject: Subject, graph: Graph, edge: int, distances: np.ndarray) -> np.ndarray:
    """``[len(distances)]``: the graph's (first) prediction with ``edge`` at each distance."""
    copies = []
    for d in distances:
        edges = graph.edges.copy()
        edges[edge, 0] = d
        copies.append(replace(graph, edges=edges))
    return subject.predict(subject.batch(copies))[:, 0]


def _jump_inside(
    subject: Subject, graph: Graph, edge: int, low: float, high: float
) -> Violation | None:
    if not high > low:
        return None
    grid = np.linspace(low, high, GRID)
    values = _predict_at(subject, graph, edge, grid)
    if not np.all(np.isfinite(values)):
        return None  # a non-finite prediction is the step property's finding
    moves = np.abs(np.diff(values))
    k = int(np.argmax(moves))
    a, b = grid[k], grid[k + 1]
    # Each end again as a batch of its own, as every halving predicts: the sweep's batch of
    # copies would tie the ends to each other in a model whose graphs are not independent.
    fa, fb = (_predict_at(subject, graph, edge, np.array([x]))[0] for x in (a, b))
    first = abs(fb - fa)
    allowed = float(agreement_tolerance(compute_dtype(subject), values).max())
    if not first > allowed:
        return None  # no step of the sweep moves beyond the tolerance: no jump to find
    ulp = float(np.spacing(np.asarray(max(abs(a), abs(b)), subject.dtype)))
    for _ in range(MAX_HALVINGS):
        if b - a <= ULPS * ulp:
            break
        mid = (a + b) / 2
        fm = _predict_at(subject, graph, edge, np.array([mid]))[0]
        if abs(fm - fa) >= abs(fb - fm):
            b, fb = mid, fm
        else:
            a, fa = mid, fm
        if not abs(fb - fa) > 0.5 * first:
            return None  # the move shrinks with the interval, as a continuous one does
    last = abs(fb - fa)
    if last > 0.5 * first and last > allowed:
        return Violation(
            f"the prediction jumps by {last:.4g} (from {fa:.6g} to {fb:.6g}) as an edge "
            f"distance moves from {a:.9g} to {b:.9g}",
            deviation=float(last),
            tolerance=allowed,
        )
    return None


def _jump_at_cutoff(subject: Subject, graph: Graph, edge: int, cutoff: float) -> Violation | None:
    ulp = float(np.spacing(np.asarray(abs(cutoff), subject.dtype)))
    below = _predict_at(subject, graph, edge, np.array([cutoff - ULPS * ulp]))
    keep = np.arange(graph.num_edges) != edge
    without = replace(
        graph,
        edges=graph.edges[keep],
        senders=graph.senders[keep],
        receivers=graph.receivers[keep],
    )
    after = subject.predict(subject.batch([without]))[:, 0]
    allowed = float(agreement_tolerance(compute_dtype(subject), below, after).max())
    move = float(abs(below[0] - after[0]))
    if not move > allowed:
        return None
    return Violation(
        f"the prediction jumps by {move:.4g} (from {below[0]:.6g} to {after[0]:.6g}) when an "
        f"edge at the declared cutoff {cutoff:g} is dropped, as data past the cutoff drops it",
        deviation=move,
        tolerance=allowed,
    )
