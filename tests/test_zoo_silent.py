"""The silent zoo bugs break their graph invariant, and the maintainers' fix mends it.

Each test builds a bug's model through its registered variant on a few graphs of its case's
data, checks the invariant the bug names with plain TensorFlow and NumPy, finds it broken
beyond a tolerance derived from the dtype's epsilon, then applies the maintainers' fix to the
same model (the buggy method swapped for the fixed one, the weights kept) and finds the
invariant holding: the check can fail and can pass.
"""

from __future__ import annotations

import math
from pathlib import Path

import keras
import numpy as np
import pytest
import tensorflow as tf

from stability.data.graphs import Graph, batch_graphs
from stability.model.variants import get_variant
from stability.sweep.cases import load_case
from stability.sweep.runner import case_datasets
from stability.train.config import TrainConfig
from stability.train.trainer import Trainer
from stability.zoo.run import BUGS, load_bug

EPS32 = float(np.finfo(np.float32).eps)


def build(name: str, dtype: str = "float32"):
    """``(model, dataset, module)``: the bug's model built by its variant on its case's data."""
    entry = load_bug(BUGS / f"{name}.toml")
    case = load_case(BUGS / f"{name}.toml")
    dataset = case_datasets(case)[0]
    config = TrainConfig(seed=0, hidden=case.hidden, dtype=dtype)
    recipe = Trainer(get_variant(entry.bug.variant), dataset, config).build()
    return recipe.model, dataset, entry.bug


def predict(model, graphs: list[Graph], dtype: str = "float32", training: bool = False):
    """``[num_graphs]`` column 0 of the model's predictions on ``graphs`` batched."""
    inputs = {k: tf.constant(v) for k, v in batch_graphs(graphs, dtype=dtype).as_inputs().items()}
    return model(inputs, training=training).numpy()[:, 0].astype(np.float64)


def patched(layer, **methods) -> None:
    """Give ``layer`` the maintainers' fix: its class becomes a subclass with ``methods``."""
    layer.__class__ = type(f"Fixed{type(layer).__name__}", (type(layer),), methods)


def tolerance(values: np.ndarray, eps: float = EPS32, factor: float = 256.0) -> float:
    """A bound for rounding: ``factor`` ulps of the largest value (at least of 1)."""
    return factor * eps * max(1.0, float(np.max(np.abs(values))))


def batch_gap(model, graphs: list[Graph]) -> tuple[float, float]:
    """(the largest change of a graph's prediction between alone and batched, tolerance)."""
    batched = predict(model, graphs)
    alone = np.array([predict(model, [g])[0] for g in graphs])
    return float(np.max(np.abs(batched - alone))), tolerance(alone)


# --- batch_independence -------------------------------------------------------------------


def segment_softmax(scores, segments, num_segments):
    """``[n]`` a softmax of ``scores`` within each segment (max subtracted per segment)."""
    top = tf.math.unsorted_segment_max(scores, segments, num_segments)
    e = tf.exp(scores - tf.gather(top, segments))
    return e / tf.gather(tf.math.unsorted_segment_sum(e, segments, num_segments), segments)


def test_spektral_attn_pool_breaks_batch_independence_and_the_fix_mends_it():
    model, data, bug = build("s_spektral_attn_pool")
    assert bug.invariant == "batch_independence"
    graphs = data.train[:6]
    gap, tol = batch_gap(model, graphs)
    assert gap > 100 * tol, f"batched and alone agree ({gap:.3g} <= {100 * tol:.3g})"

    def weights_of(self, attn_coeff, graph, num_graphs):  # commit 570cb91: per graph
        return segment_softmax(attn_coeff, graph, num_graphs)

    patched(model.pool, weights_of=weights_of)
    gap, tol = batch_gap(model, graphs)
    assert gap <= tol, f"the fixed pool still depends on the batch ({gap:.3g} > {tol:.3g})"


def test_pyg_set2set_padding_breaks_batch_independence_and_the_fix_mends_it():
    model, data, bug = build("s_pyg_set2set_padding")
    assert bug.invariant == "batch_independence"
    graphs = sorted(data.train[:6], key=lambda g: g.num_nodes)  # sizes differ: padding
    assert graphs[0].num_nodes < graphs[-1].num_nodes
    gap, tol = batch_gap(model, graphs)
    assert gap > 100 * tol, f"batched and alone agree ({gap:.3g} <= {100 * tol:.3g})"

    def read(self, x, q, graph, num_graphs):  # commit 3b66ade: softmax(e, batch), scatter_add
        e = tf.reduce_sum(x * tf.gather(q, graph), axis=-1)
        a = segment_softmax(e, graph, num_graphs)
        return tf.math.unsorted_segment_sum(a[:, None] * x, graph, num_graphs)

    patched(model.pool, read=read)
    gap, tol = batch_gap(model, graphs)
    assert gap <= tol, f"the fixed Set2Set still depends on the batch ({gap:.3g} > {tol:.3g})"


def test_graphormer_batch_softmax_breaks_batch_independence_and_the_fix_mends_it():
    model, data, bug = build("s_graphormer_batch_softmax")
    assert bug.invariant == "batch_independence"
    graphs = data.train[:6]
    gap, tol = batch_gap(model, graphs)
    assert gap > 100 * tol, f"batched and alone agree ({gap:.3g} <= {100 * tol:.3g})"

    def weights_of(self, a, same_graph):  # f56d648's intent: no weight outside the graph
        return tf.nn.softmax(tf.where(same_graph > 0, a, -math.inf), axis=-1)

    for head in model.layers_:
        patched(head, weights_of=weights_of)
    gap, tol = batch_gap(model, graphs)
    assert gap <= tol, f"the fixed head still depends on the batch ({gap:.3g} > {tol:.3g})"


# --- edge_order ---------------------------------------------------------------------------


def shuffled_edges(graph: Graph, seed: int) -> Graph:
    """``graph`` with its edge list in another order (endpoints and distances together)."""
    order = np.random.default_rng(seed).permutation(graph.num_edges)
    return Graph(graph.nodes, graph.edges[order], graph.senders[order], graph.receivers[order], 0.0)


def test_spektral_edge_features_break_edge_order_and_the_fix_mends_it():
    model, data, bug = build("s_spektral_edge_features")
    assert bug.invariant == "edge_order"
    graphs = [g for g in data.train if g.num_edges > 4][:4]

    def gap() -> tuple[float, float]:
        original = predict(model, graphs)
        shuffled = predict(model, [shuffled_edges(g, seed) for seed, g in enumerate(graphs)])
        return float(np.max(np.abs(shuffled - original))), tolerance(original)

    broken, tol = gap()
    assert broken > 100 * tol, f"shuffling the edges changed nothing ({broken:.3g})"

    def edge_features(self, inputs):  # commit e6e95a1: the features sorted with the edges
        n = tf.shape(inputs["nodes"])[0]
        order = tf.argsort(inputs["receivers"] * n + inputs["senders"], stable=True)
        return tf.gather(inputs["edges"], order)

    patched(model, edge_features=edge_features)
    fixed, tol = gap()
    assert fixed <= tol, f"the fixed model still depends on the edge order ({fixed:.3g})"


# --- node_permutation ---------------------------------------------------------------------


def renumbered(graph: Graph, seed: int) -> Graph:
    """``graph`` with its nodes renumbered (the edges' endpoints renumbered with them)."""
    perm = np.random.default_rng(seed).permutation(graph.num_nodes)  # new node k = old perm[k]
    new_index = np.argsort(perm)  # old node i is new node new_index[i]
    return Graph(
        graph.nodes[perm],
        graph.edges,
        new_index[graph.senders].astype(np.int32),
        new_index[graph.receivers].astype(np.int32),
        0.0,
    )


def test_chainer_ggnn_transpose_breaks_node_permutation_and_the_fix_mends_it():
    model, data, bug = build("s_chainer_ggnn_transpose")
    assert bug.invariant == "node_permutation"
    graphs = [g for g in data.train if g.num_edges > 4][:4]

    def gap() -> tuple[float, float]:
        original = np.array([predict(model, [g])[0] for g in graphs])
        moved = np.array([predict(model, [renumbered(g, s)])[0] for s, g in enumerate(graphs)])
        return float(np.max(np.abs(moved - original))), tolerance(original)

    broken, tol = gap()
    assert broken > 100 * tol, f"renumbering the atoms changed nothing ({broken:.3g})"

    def transpose_messages(self, m):  # PR #143: (minibatch, edge_type, atom, ch)
        return tf.transpose(m, (0, 3, 1, 2))

    patched(model, transpose_messages=transpose_messages)
    fixed, tol = gap()
    assert fixed <= tol, f"the fixed GGNN still depends on the numbering ({fixed:.3g})"


# --- edge_continuity ----------------------------------------------------------------------


def test_torchmd_et_cutoff_breaks_edge_continuity_and_the_fix_mends_it():
    model, data, bug = build("s_torchmd_et_cutoff")
    assert bug.invariant == "edge_continuity"
    cutoff = data.cutoff
    # Trained biases are not 0 (Keras starts them at 0, where dv_proj's bias is harmless):
    # give every bias a draw of the size training gives them.
    rng = np.random.default_rng(0)
    for weight in model.weights:
        if weight.path.endswith("bias"):
            weight.assign(rng.normal(0.0, 0.3, weight.shape).astype(np.float32))
    graphs = [g for g in data.train if g.num_edges > 4][:4]
    delta = 1e-3  # the pair moves from cutoff - delta to just past the cutoff

    def jumps() -> tuple[float, float]:
        inside, outside = [], []
        for g in graphs:
            far = int(np.argmax(g.edges[:, 0]))  # the pair nearest the cutoff, both ways
            pair = (g.senders == g.senders[far]) & (g.receivers == g.receivers[far])
            pair |= (g.senders == g.receivers[far]) & (g.receivers == g.senders[far])
            edges = g.edges.copy()
            edges[pair] = cutoff - delta
            inside.append(Graph(g.nodes, edges, g.senders, g.receivers, 0.0))
            # past the cutoff the radius graph has no edge between them
            keep = ~pair
            outside.append(Graph(g.nodes, g.edges[keep], g.senders[keep], g.receivers[keep], 0.0))
        near, past = predict(model, inside), predict(model, outside)
        return float(np.max(np.abs(near - past))), tolerance(near)

    jump, tol = jumps()
    assert jump > 100 * tol, f"no step at the cutoff ({jump:.3g} <= {100 * tol:.3g})"

    def weigh(self, attn, v_j, cutoff):  # PR #260, vector_cutoff: the values weighted
        return attn, v_j * cutoff

    for layer in model.layers_:
        patched(layer, weigh=weigh)
    jump, tol = jumps()
    assert jump <= tol, f"the fixed ET still steps at the cutoff ({jump:.3g} > {tol:.3g})"


# --- dtype_agreement ----------------------------------------------------------------------


def test_keras_fast_variance_breaks_dtype_agreement_and_the_fix_mends_it():
    model32, data, bug = build("s_keras_fast_variance", "float32")
    model64, _, _ = build("s_keras_fast_variance", "float64")
    assert bug.invariant == "dtype_agreement"
    model64.set_weights([w.astype(np.float64) for w in model32.get_weights()])
    # The float64 model reads the float32-rounded data, so only the arithmetic differs.
    graphs = data.train[:16]
    rounded = [
        Graph(g.nodes.astype(np.float32), g.edges.astype(np.float32), g.senders, g.receivers, 0)
        for g in graphs
    ]

    def disagreement() -> tuple[float, float]:
        # training=True: BatchNormalization standardizes with the batch's own moments
        single = predict(model32, rounded, "float32", training=True)
        double = predict(model64, rounded, "float64", training=True)
        # float32's rounding of the heights' mean (a few ulps of 1000 A against a 0.6 A
        # spread) bounds an agreeing pair: 2^9 ulps of the output scale
        return float(np.max(np.abs(single - double))), tolerance(double, factor=2.0**9)

    broken, tol = disagreement()
    assert broken > 100 * tol, f"float32 and float64 agree ({broken:.3g} <= {100 * tol:.3g})"

    stock = keras.layers.BatchNormalization._moments  # commit 9815ac1: tf.nn.moments
    patched(model32.standardize, _moments=stock)
    patched(model64.standardize, _moments=stock)
    fixed, tol = disagreement()
    assert fixed <= tol, f"the fixed normalization still disagrees ({fixed:.3g} > {tol:.3g})"


@pytest.mark.parametrize("path", sorted(BUGS.glob("s_*.toml")), ids=lambda p: Path(p).stem)
def test_every_silent_bug_names_its_invariant(path):
    bug = load_bug(path).bug
    assert bug.silent and bug.invariant and bug.stage == "forward"
    # Training names an exposed attention that does not sum to 1 (the guard's check); it
    # names nothing for the other invariants.
    expected = "normalization" if bug.invariant == "attention_normalization" else "none"
    assert bug.cause == expected


# --- attention_normalization --------------------------------------------------------------


def normalization_gap(model, graphs: list[Graph]) -> tuple[float, float]:
    """(the largest distance from 1 of a node's summed attention, per layer and head, over
    the nodes with incoming edges; the step guard's bound ``(8 + 4 d) eps`` at its node)."""
    inputs = {k: tf.constant(v) for k, v in batch_graphs(graphs).as_inputs().items()}
    out = model.forward(inputs)
    assert np.all(np.isfinite(out["predictions"].numpy())), "the bug is silent: no NaN"
    worst, bound = 0.0, 0.0
    for alpha, receivers in zip(out["alpha"], out["receivers"], strict=True):
        alpha = tf.reshape(alpha, (tf.shape(alpha)[0], -1)).numpy().astype(np.float64)
        receivers = receivers.numpy()
        num_nodes = int(inputs["nodes"].shape[0])
        sums = np.zeros((num_nodes, alpha.shape[1]))
        np.add.at(sums, receivers, alpha)
        degree = np.bincount(receivers, minlength=num_nodes)
        gap = np.max(np.abs(sums[degree > 0] - 1.0), axis=1)
        at = int(np.argmax(gap))
        if gap[at] >= worst:
            worst, bound = float(gap[at]), (8 + 4 * int(degree[degree > 0][at])) * EPS32
    return worst, bound


def test_graphlearn_gat_softmax_breaks_attention_normalization_and_the_fix_mends_it():
    model, data, bug = build("s_graphlearn_gat_softmax")
    assert bug.invariant == "attention_normalization"
    graphs = data.train[:6]
    gap, tol = normalization_gap(model, graphs)
    assert gap > 100 * tol, f"the weights sum to 1 ({gap:.3g} <= {100 * tol:.3g})"

    def normalize(self, scores, segment_ids, num_segments):  # PR #26: per node's neighbours
        coefficients = tf.exp(scores)
        total = tf.math.unsorted_segment_sum(coefficients, segment_ids, num_segments)
        return coefficients / tf.gather(total, segment_ids)

    for conv in model.convs:
        patched(conv, normalize=normalize)
    gap, tol = normalization_gap(model, graphs)
    assert gap <= tol, f"the fixed GATConv's weights still miss 1 ({gap:.3g} > {tol:.3g})"


def test_geometricflux_gat_heads_breaks_attention_normalization_and_the_fix_mends_it():
    model, data, bug = build("s_geometricflux_gat_heads")
    assert bug.invariant == "attention_normalization"
    graphs = data.train[:6]
    gap, tol = normalization_gap(model, graphs)
    assert gap > 100 * tol, f"the weights sum to 1 ({gap:.3g} <= {100 * tol:.3g})"

    def normalize(self, e, receivers, num_nodes):  # PR #131: softmax over neighbours, per head
        return segment_softmax(e, receivers, num_nodes)

    for conv in model.convs:
        patched(conv, normalize=normalize)
    gap, tol = normalization_gap(model, graphs)
    assert gap <= tol, f"the fixed GATConv's weights still miss 1 ({gap:.3g} > {tol:.3g})"
