"""Graphs and batches of graphs, as flat arrays in the jraph ``GraphsTuple`` layout.

A batch of ``num_graphs`` graphs is one disconnected graph: node and edge arrays are
concatenated and the edge endpoints are offset so that they index the batch's nodes.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from stability.core.errors import DataError

#: Names of the arrays a model receives, in the order of ``GraphBatch.as_inputs``.
INPUT_NAMES = ("nodes", "edges", "senders", "receivers", "node_graph", "num_graphs")
#: Extra inputs of a padded batch: which edges and graphs are real (``stability.data.padding``).
MASK_NAMES = ("edge_mask", "graph_mask")


class _Sizes:
    """``num_nodes`` and ``num_edges`` of anything with ``nodes`` and ``edges`` arrays (a graph
    or a batch of them)."""

    nodes: np.ndarray
    edges: np.ndarray

    @property
    def num_nodes(self) -> int:
        return int(self.nodes.shape[0])

    @property
    def num_edges(self) -> int:
        return int(self.edges.shape[0])


@dataclass(frozen=True)
class Graph(_Sizes):
    """One graph with a scalar target.

    Shapes:
        nodes: ``[num_nodes, num_features]`` float node features.
        edges: ``[num_edges, 1]`` the edge distance ``e``.
        senders, receivers: ``[num_edges]`` int node indices; a message flows sender -> receiver.
        target: the graph's scalar target, in its own units.
        source_index: the graph's index in the user's own data (a file, a list) before any
            shuffle or split; errors name the graph by it. ``None``: by its place in the data
            set (train first, then validation).
    """

    nodes: np.ndarray
    edges: np.ndarray
    senders: np.ndarray
    receivers: np.ndarray
    target: float
    source_index: int | None = None


@dataclass(frozen=True)
class GraphBatch(_Sizes):
    """Several graphs batched into one.

    Shapes:
        nodes: ``[num_nodes, num_features]``
        edges: ``[num_edges, 1]``
        senders, receivers: ``[num_edges]`` int32, indices into ``nodes``
        node_graph: ``[num_nodes]`` int32, the graph each node belongs to
        num_graphs: the number of graphs (some may have no nodes)
        targets: ``[num_graphs]`` the graph targets, in whatever scale the caller chose
        edge_mask, graph_mask: ``[num_edges]`` and ``[num_graphs]`` bool, False on the
            padding of a padded batch (``stability.data.padding``); None for a batch without
            padding
    """

    nodes: np.ndarray
    edges: np.ndarray
    senders: np.ndarray
    receivers: np.ndarray
    node_graph: np.ndarray
    num_graphs: int
    targets: np.ndarray
    edge_mask: np.ndarray | None = None
    graph_mask: np.ndarray | None = None

    def as_inputs(self) -> dict[str, np.ndarray]:
        """The model's inputs, keyed by ``INPUT_NAMES`` plus ``MASK_NAMES`` for a padded
        batch; ``num_graphs`` as a 0-d int32 array."""
        inputs = {name: getattr(self, name) for name in INPUT_NAMES}
        inputs["num_graphs"] = np.asarray(self.num_graphs, np.int32)
        if self.padded:
            inputs.update({name: getattr(self, name) for name in MASK_NAMES})
        return inputs

    @property
    def padded(self) -> bool:
        return self.graph_mask is not None


def batch_graphs(
    graphs: Sequence[Graph], targets: np.ndarray | None = None, dtype: str = "float32"
) -> GraphBatch:
    """Concatenate ``graphs`` into one ``GraphBatch``.

    ``targets`` overrides the graphs' own targets (for example, scaled ones); it has shape
    ``[len(graphs)]``.
    """
    if not graphs:
        raise DataError("cannot batch an empty list of graphs")
    num_nodes = np.array([g.num_nodes for g in graphs])
    num_edges = np.array([g.num_edges for g in graphs])
    # Each graph's edge indices are shifted by the number of nodes before it in the batch.
    offsets = np.repeat(np.cumsum(num_nodes) - num_nodes, num_edges)
    if targets is None:
        targets = np.array([g.target for g in graphs])
    num_features = graphs[0].nodes.shape[1]
    return GraphBatch(
        nodes=np.concatenate([g.nodes for g in graphs]).astype(dtype).reshape(-1, num_features),
        edges=np.concatenate([g.edges for g in graphs]).astype(dtype).reshape(-1, 1),
        senders=(np.concatenate([g.senders for g in graphs]) + offsets).astype(np.int32),
        receivers=(np.concatenate([g.receivers for g in graphs]) + offsets).astype(np.int32),
        node_graph=np.repeat(np.arange(len(graphs)), num_nodes).astype(np.int32),
        num_graphs=len(graphs),
        targets=np.asarray(targets, dtype=dtype),
    )


def validate_graph(
    graph: Graph, index: int, allow_nonfinite: bool = False, allow_negative: bool = False
) -> None:
    """Raise ``DataError`` naming graph ``index`` and the field if ``graph`` is malformed.

    With ``allow_nonfinite``, NaN and +-Inf values pass (``nonfinite_field`` finds them);
    shapes and edge endpoints are checked either way, and negative distances unless
    ``allow_negative`` (edges that are a transformed feature, not a distance).
    """
    where = graph_label(graph, index)
    if graph.nodes.ndim != 2:
        raise DataError(f"{where}: nodes must be [num_nodes, features], got {graph.nodes.shape}")
    if graph.edges.shape != (graph.num_edges, 1):
        raise DataError(f"{where}: edges must be [num_edges, 1], got {graph.edges.shape}")
    for field in ("senders", "receivers"):
        idx = getattr(graph, field)
        if idx.shape != (graph.num_edges,):
            raise DataError(f"{where}: {field} must be [num_edges], got {idx.shape}")
        if idx.size and (idx.min() < 0 or idx.max() >= graph.num_nodes):
            raise DataError(
                f"{where}: {field} points at node {int(idx.max())} (or {int(idx.min())}), "
                f"but the graph has {graph.num_nodes} nodes"
            )
    field = nonfinite_field(graph)
    if field is not None and not allow_nonfinite:
        raise DataError(nonfinite_message(graph, index, field))
    finite = graph.edges[np.isfinite(graph.edges)]
    if not allow_negative and (finite < 0).any():
        raise DataError(f"{where}: edges hold negative distances (min {finite.min():g})")


def graph_label(graph: Graph, index: int) -> str:
    """ "graph N": N is the user's own index (``source_index``) when the graph has one, else
    ``index``, its place in the data set."""
    return f"graph {index if graph.source_index is None else graph.source_index}"


def nonfinite_message(graph: Graph, index: int, field: str) -> str:
    """One line naming graph ``index`` (or its ``source_index``) and its non-finite ``field``."""
    if field == "target":
        return f"{graph_label(graph, index)}: target {graph.target!r} is not finite"
    what = "distances" if field == "edges" else "values"
    return f"{graph_label(graph, index)}: {field} hold non-finite {what}"


def nonfinite_field(graph: Graph) -> str | None:
    """The first of nodes, edges and target that holds NaN or +-Inf, or ``None``."""
    if not np.isfinite(graph.nodes).all():
        return "nodes"
    if not np.isfinite(graph.edges).all():
        return "edges"
    if not np.isfinite(graph.target):
        return "target"
    return None
