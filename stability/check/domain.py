"""The inputs the check may draw for a case: its declared bounds, and graphs within them.

The bounds are the case data set's own: its node and edge counts, its distances from
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
from hypothesis.extra.numpy import arrays

from stability.data import Dataset
from stability.data.graphs import Graph

#: At most this many distinct node rows are drawn from (the data's first ones).
MAX_ROWS = 64

#: At most this many edges in a drawn graph (the data's largest graph's, up to this).
MAX_EDGES = 256

#: At most this many graphs in a drawn batch: enough for batch effects, small to shrink.
MAX_GRAPHS = 4


@dataclass(frozen=True)
class Domain:
    """The case's declared bounds.

    ``rows``: ``[num_rows, num_features]`` node feature rows to draw from; distances in
    ``[low, high]``; ``max_nodes`` nodes and ``max_edges`` edges in a graph at most;
    ``self_loops`` whether the data holds ``i -> i`` edges; ``target`` the value a drawn
    graph's target takes (the training targets' mean: the loss then sees a typical target).
    """

    rows: np.ndarray
    low: float
    high: float
    max_nodes: int
    max_edges: int
    self_loops: bool
    target: float

    @classmethod
    def of(cls, dataset: Dataset) -> Domain:
        graphs = dataset.train + dataset.val
        rows = np.unique(np.concatenate([g.nodes for g in graphs]), axis=0)[:MAX_ROWS]
        finite = np.isfinite(dataset.edge_min) and np.isfinite(dataset.edge_max)
        return cls(
            rows=rows,
            low=float(dataset.edge_min) if finite else 0.0,
            high=float(dataset.edge_max) if finite else 1.0,
            max_nodes=max(g.num_nodes for g in graphs),
            max_edges=min(max(g.num_edges for g in graphs), MAX_EDGES),
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
    """One graph: its node count and edge count, then arrays of node rows, receivers,
    senders and distances. Each array is drawn around one fill value with a few other
    elements (``hypothesis.extra.numpy.arrays``' sparse filling), so a drawn graph is often
    an edge case of its own: every node the same row (constant features), every edge into
    one node (a hub), every distance the same (coincident neighbours). Without self-loops in
    the data, an edge ``i -> i`` is moved to ``i -> i + 1``. Shrinks towards one node, no
    edges, node 0 and row 0 everywhere, and the smallest distance."""
    num_nodes = draw(st.integers(1, domain.max_nodes))
    num_edges = draw(st.integers(0, domain.max_edges)) if num_nodes > 1 or domain.self_loops else 0
    rows = draw(arrays(np.int64, num_nodes, elements=st.integers(0, len(domain.rows) - 1)))
    node = st.integers(0, num_nodes - 1)
    receivers = draw(arrays(np.int64, num_edges, elements=node))
    senders = draw(arrays(np.int64, num_edges, elements=node))
    if not domain.self_loops:
        loops = senders == receivers
        senders[loops] = (senders[loops] + 1) % num_nodes
    distances = draw(arrays(np.float64, num_edges, elements=domain.distances()))
    return Graph(
        nodes=domain.rows[rows],
        edges=distances.reshape(-1, 1),
        senders=senders.astype(np.int32),
        receivers=receivers.astype(np.int32),
        target=domain.target,
    )
