"""A data set with an edge from every node to itself: the doctor's self-loop remedy, and the
case key ``self_loops``.

A node that no edge enters has an empty neighbourhood, and every aggregation over it is an
empty one: its degree is 0 (``deg ** -0.5`` is inf), its segment max is the dtype's lowest
value, its softmax denominator and its sum of exponentials are 0. A self-loop gives every
node one neighbour, itself, so no neighbourhood is empty: DGL's advice for graphs with
0-in-degree nodes (``dgl.add_self_loop``, the error its ``GraphConv`` raises) and GCN's
``A + I``. A self-loop's distance is 0, a node's distance to itself.

The nodes, targets and split stay as they are; the key says what was done, so runs on the
changed data are never mistaken for runs on the original.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from stability.data.graphs import Graph
from stability.data.registry import Dataset


def with_self_loops(dataset: Dataset) -> Dataset:
    """``dataset`` with one more edge per node, from the node to itself, of distance 0."""
    return Dataset(
        key=f"{dataset.key} | self-loops",
        train=[looped(g) for g in dataset.train],
        val=[looped(g) for g in dataset.val],
        cutoff=dataset.cutoff,
        signed_edges=dataset.signed_edges,
    )


def looped(graph: Graph) -> Graph:
    """``graph`` with the edges ``i -> i`` after its own: ``edges`` ``[num_edges +
    num_nodes, features]``, ``senders``/``receivers`` ``[num_edges + num_nodes]``."""
    nodes = np.arange(graph.num_nodes, dtype=graph.senders.dtype)
    zeros = np.zeros((graph.num_nodes, *graph.edges.shape[1:]), dtype=graph.edges.dtype)
    return replace(
        graph,
        edges=np.concatenate([graph.edges, zeros]),
        senders=np.concatenate([graph.senders, nodes]),
        receivers=np.concatenate([graph.receivers, nodes.astype(graph.receivers.dtype)]),
    )
