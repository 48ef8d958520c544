"""The inputs the check may draw for a case: its declared bounds, and graphs within them.

The bounds are the case data set's own: its node count and in-degree, its distances from
the smallest to the largest, the node feature rows it holds (a one-hot type stays one-hot,
a molecule's atom stays an atom of the data). ``graph_lists`` draws batches of such graphs
and, deliberately, at the bounds' edges: one graph alone, a single node, a graph without
edges, isolated nodes, duplicate edges (coincident neighbours), every node the same row,
one node receiving every edge, distances at the smallest and the largest. Hypothesis
shrinks a failing batch towards those, so a counterexample comes out small.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from hypothesis import strategies as st

from stability.data import Dataset
from stability.data.graphs import Graph

#: At most this many distinct node rows are drawn from (the data's first ones).
MAX_ROWS = 64

#: At most this many graphs in a drawn batch: enough for batch effects, small to shrink.
MAX_GRAPHS = 4


@dataclass(frozen=True)
class Domain:
    """The case's declared bounds.

    ``rows``: ``[num_rows, num_features]`` node feature rows to draw from; distances in
    ``[low, high]``; ``max_nodes`` nodes and ``max_in_degree`` incoming edges at most;
    ``self_loops`` whether the data holds ``i -> i`` edges; ``target`` the value a drawn
    graph's target takes (the training targets' mean: the loss then sees a typical target).
    """

    rows: np.ndarray
    low: float
    high: float
    max_nodes: int
    max_in_degree: int
    self_loops: bool
    target: float

    @classmethod
    def of(cls, dataset: Dataset) -> Domain:
        graphs = dataset.train + dataset.val
        rows = np.unique(np.concatenate([g.nodes for g in graphs]), axis=0)[:MAX_ROWS]
        degrees = [
            int(np.bincount(g.receivers, minlength=g.num_nodes).max()) if g.num_edges else 0
            for g in graphs
        ]
        finite = np.isfinite(dataset.edge_min) and np.isfinite(dataset.edge_max)
        return cls(
            rows=rows,
            low=float(dataset.edge_min) if finite else 0.0,
            high=float(dataset.edge_max) if finite else 1.0,
            max_nodes=max(g.num_nodes for g in graphs),
            max_in_degree=max(max(degrees), 1),
            self_loops=any(bool(np.any(g.senders == g.receivers)) for g in graphs),
            target=float(dataset.target_mean),
        )

    def distances(self) -> st.SearchStrategy[float]:
        """A distance within the bounds; first the bounds themselves, which shrink first."""
        edges = st.sampled_from([self.low, self.high])
        if self.high <= self.low:
            return edges
        return st.one_of(edges, st.floats(self.low, self.high, allow_nan=False))

    def graphs(self) -> st.SearchStrategy[Graph]:
        return _graph(self)

    def graph_lists(self) -> st.SearchStrategy[list[Graph]]:
        """Batches of 1 to ``MAX_GRAPHS`` graphs within the bounds."""
        return st.lists(self.graphs(), min_size=1, max_size=MAX_GRAPHS)


@st.composite
def _graph(draw: st.DrawFn, domain: Domain) -> Graph:
    """One graph: nodes, then each node's incoming edges (none to ``max_in_degree``), each
    from a drawn sender with a drawn distance. Shrinks towards one node, no edges, every
    node the first row, every sender node 0 (a hub) and the smallest distance."""
    num_nodes = draw(st.integers(1, domain.max_nodes))
    rows = draw(
        st.lists(st.integers(0, len(domain.rows) - 1), min_size=num_nodes, max_size=num_nodes)
    )
    senders, receivers, distances = [], [], []
    others = num_nodes if domain.self_loops else num_nodes - 1
    if others > 0:
        for node in range(num_nodes):
            degree = draw(st.integers(0, domain.max_in_degree))
            for _ in range(degree):
                pick = draw(st.integers(0, others - 1))
                # Without self-loops the senders skip the node itself.
                senders.append(pick if domain.self_loops or pick < node else pick + 1)
                receivers.append(node)
                distances.append(draw(domain.distances()))
    # The edge list in a drawn order, as a user's list comes (it shrinks to sorted).
    order = np.array(draw(st.permutations(range(len(senders)))), dtype=np.int64)
    return Graph(
        nodes=domain.rows[np.array(rows, dtype=np.int64)],
        edges=np.array(distances, dtype=np.float64).reshape(-1, 1)[order],
        senders=np.array(senders, dtype=np.int32)[order],
        receivers=np.array(receivers, dtype=np.int32)[order],
        target=domain.target,
    )
