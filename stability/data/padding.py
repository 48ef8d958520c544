"""Padding batches to one fixed shape, so that an XLA-compiled step compiles once per run.

XLA compiles a step once per input shape, and batches of random graphs rarely share one:
one epoch of the seed case holds 57 distinct (nodes, edges) shapes in 57 batches, and each
compile took 2-3 s on this machine. A padded batch has the shape of a ``Budget``
instead, chosen per run from the training graphs so that almost every batch fits it.

The layout is jraph's ``pad_with_graphs``: after the real graphs comes one padding graph
that owns every padding node, and every padding edge is a self-loop on its first node, with
distance 0. Padding therefore never shares a node, an edge or a graph with real data, and
``edge_mask`` / ``graph_mask`` say which entries are real:

- ``AttentionMessagePassing`` gives padding edges a logit of 0, so their softmax is finite;
- ``GraphNetwork`` gives padding graphs a prediction of 0, so their loss term is exactly 0;
- the trainer rescales the batch-mean loss from all graphs to the real ones.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from stability.core.errors import DataError
from stability.data.graphs import Graph, GraphBatch

#: Budgets and overflow shapes are rounded up to these multiples, so that the rare batch
#: that does not fit the budget still lands on one of a few shapes.
NODE_QUANTUM = 64
EDGE_QUANTUM = 256
#: How far above the mean batch a budget reaches, in standard deviations of a batch's size.
#: A normally distributed size exceeds mean + 4 sd about once in 30 000 batches; all 2850
#: batches of 32 in 50 shuffled epochs of the seed case fit its budget.
SIGMAS = 4.0


@dataclass(frozen=True)
class Budget:
    """The shape every padded batch has: ``[nodes, ...]``, ``[edges, ...]``, ``[graphs]``.

    ``nodes`` counts at least one padding node; ``graphs`` counts the padding graph.
    """

    nodes: int
    edges: int
    graphs: int


def budget_for(graphs: Sequence[Graph], batch_size: int, sigmas: float = SIGMAS) -> Budget:
    """A budget that fits a batch of ``batch_size`` graphs drawn from ``graphs`` at random,
    except with a probability of about a normal tail beyond ``sigmas``.

    It is never more than the largest possible batch, so small data sets pad no further
    than their ``batch_size`` biggest graphs.
    """
    if not graphs:
        raise DataError("cannot pad batches of an empty list of graphs")
    k = min(batch_size, len(graphs))
    nodes = _quota([g.num_nodes for g in graphs], k, sigmas, NODE_QUANTUM)
    edges = _quota([g.num_edges for g in graphs], k, sigmas, EDGE_QUANTUM)
    return Budget(nodes=nodes + 1, edges=max(edges, 1), graphs=batch_size + 1)


def _quota(sizes: list[int], k: int, sigmas: float, quantum: int) -> int:
    """The total size of ``k`` of ``sizes`` drawn without replacement, at mean + sigmas sd,
    rounded up to ``quantum`` and capped at the ``k`` largest sizes' total."""
    table = np.asarray(sizes, dtype=np.float64)
    n = len(table)
    mean = k * table.mean()
    # Drawing k of n graphs without replacement: the finite-population correction.
    variance = k * table.var() * (n - k) / (n - 1) if n > 1 else 0.0
    largest = int(np.sort(table)[n - k :].sum())
    return min(largest, _round_up(math.ceil(mean + sigmas * math.sqrt(variance)), quantum))


def _round_up(value: int, quantum: int) -> int:
    return max(quantum, -(-value // quantum) * quantum)


def padded_shape(batch: GraphBatch, budget: Budget) -> Budget:
    """The budget if ``batch`` fits it, else the budget grown to the next quantum that fits."""
    nodes, edges = batch.num_nodes + 1, batch.num_edges  # + 1: the padding graph's node
    return Budget(
        nodes=budget.nodes if nodes <= budget.nodes else _round_up(nodes, NODE_QUANTUM),
        edges=budget.edges if edges <= budget.edges else _round_up(edges, EDGE_QUANTUM),
        graphs=max(budget.graphs, batch.num_graphs + 1),
    )


def pad_batch(batch: GraphBatch, budget: Budget) -> GraphBatch:
    """``batch`` padded to ``padded_shape(batch, budget)``, with its masks.

    Shapes: nodes ``[budget.nodes, num_features]``, edges ``[budget.edges, 1]``, senders,
    receivers and ``edge_mask`` ``[budget.edges]``, node_graph ``[budget.nodes]``, targets
    and ``graph_mask`` ``[budget.graphs]`` (larger for a batch beyond the budget).
    """
    if batch.padded:
        raise DataError("the batch is padded already")
    shape = padded_shape(batch, budget)
    extra_nodes = shape.nodes - batch.num_nodes
    extra_edges = shape.edges - batch.num_edges
    extra_graphs = shape.graphs - batch.num_graphs
    first_pad = batch.num_nodes  # every padding edge is a self-loop on this node
    return GraphBatch(
        nodes=np.concatenate([batch.nodes, np.zeros((extra_nodes, batch.nodes.shape[1]))]).astype(
            batch.nodes.dtype
        ),
        edges=np.concatenate([batch.edges, np.zeros((extra_edges, 1), batch.edges.dtype)]),
        senders=np.concatenate([batch.senders, np.full(extra_edges, first_pad, np.int32)]),
        receivers=np.concatenate([batch.receivers, np.full(extra_edges, first_pad, np.int32)]),
        node_graph=np.concatenate(
            [batch.node_graph, np.full(extra_nodes, batch.num_graphs, np.int32)]
        ),
        num_graphs=shape.graphs,
        targets=np.concatenate([batch.targets, np.zeros(extra_graphs, batch.targets.dtype)]),
        edge_mask=np.arange(shape.edges) < batch.num_edges,
        graph_mask=np.arange(shape.graphs) < batch.num_graphs,
    )
