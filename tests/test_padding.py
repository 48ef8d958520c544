"""Padded batches: one shape per run, the real graphs' numbers unchanged, padding inert."""

from dataclasses import replace

import numpy as np
import pytest
import tensorflow as tf
from conftest import jit_agreement
from test_sentinel import overflowing_attention

from stability.core.errors import DataError
from stability.core.results import TIMING_FIELDS
from stability.data.graphs import Graph, batch_graphs
from stability.data.padding import EDGE_QUANTUM, Budget, budget_for, pad_batch, padded_shape
from stability.model.recipe import Variant
from stability.model.variants import get_variant
from stability.train.config import TrainConfig
from stability.train.guard import StepReport
from stability.train.step import input_signature, make_train_step, real_mean
from stability.train.trainer import Trainer


def real_batch(dataset, size=16):
    graphs = dataset.train[:size]
    return batch_graphs(graphs, targets=np.linspace(-1.0, 1.0, len(graphs)))


def build(dataset, variant="raw_e", seed=0):
    config = TrainConfig(seed=seed, hidden=8, dtype="float32")
    return Trainer(get_variant(variant), dataset, config).build()


def test_a_padded_batch_has_the_budget_shape_and_masks(tiny_dataset):
    batch = real_batch(tiny_dataset)
    budget = budget_for(tiny_dataset.train, 16)
    padded = pad_batch(batch, budget)
    assert (padded.num_nodes, padded.num_edges, padded.num_graphs) == (
        budget.nodes,
        budget.edges,
        budget.graphs,
    )
    assert padded.edge_mask.sum() == batch.num_edges
    assert padded.graph_mask.sum() == batch.num_graphs
    # The real part comes first and is unchanged.
    np.testing.assert_array_equal(padded.senders[: batch.num_edges], batch.senders)
    np.testing.assert_array_equal(padded.nodes[: batch.num_nodes], batch.nodes)
    # Padding touches only padding: its edges are self-loops on the first padding node,
    # and its nodes belong to the padding graph.
    assert (padded.senders[batch.num_edges :] == batch.num_nodes).all()
    assert (padded.receivers[batch.num_edges :] == batch.num_nodes).all()
    assert (padded.node_graph[batch.num_nodes :] == batch.num_graphs).all()


def test_every_batch_of_an_epoch_fits_one_budget(tiny_dataset):
    budget = budget_for(tiny_dataset.train, 8)
    order = np.random.default_rng(0).permutation(len(tiny_dataset.train))
    shapes = {
        padded_shape(batch_graphs([tiny_dataset.train[i] for i in order[s : s + 8]]), budget)
        for s in range(0, len(order), 8)
    }
    assert shapes == {budget}


def test_a_batch_beyond_the_budget_grows_to_the_next_quantum(tiny_dataset):
    batch = real_batch(tiny_dataset)
    small = Budget(nodes=2, edges=EDGE_QUANTUM, graphs=2)
    shape = padded_shape(batch, small)
    assert shape.edges % EDGE_QUANTUM == 0 and shape.edges >= batch.num_edges
    assert shape.nodes > batch.num_nodes and shape.graphs == batch.num_graphs + 1
    assert pad_batch(batch, small).num_edges == shape.edges


def test_the_budget_never_exceeds_the_largest_possible_batch(tiny_dataset):
    budget = budget_for(tiny_dataset.train, len(tiny_dataset.train))
    assert budget.edges == sum(g.num_edges for g in tiny_dataset.train)
    assert budget.nodes == sum(g.num_nodes for g in tiny_dataset.train) + 1


def test_padding_twice_and_empty_data_are_errors(tiny_dataset):
    budget = budget_for(tiny_dataset.train, 16)
    with pytest.raises(DataError, match="padded already"):
        pad_batch(pad_batch(real_batch(tiny_dataset), budget), budget)
    with pytest.raises(DataError, match="empty"):
        budget_for([], 16)


def loss_and_gradients(recipe, batch):
    inputs = {k: tf.constant(v) for k, v in batch.as_inputs().items()}
    with tf.GradientTape() as tape:
        out = recipe.model.forward(inputs)
        loss = real_mean(recipe.loss(tf.constant(batch.targets), out["predictions"]), inputs)
    return out, loss, tape.gradient(loss, recipe.model.trainable_variables)


@pytest.mark.parametrize("variant", ["raw_e", "stable_softmax", "sigma_clip"])
def test_padding_leaves_the_real_graphs_forward_loss_and_gradients_alone(variant, tiny_dataset):
    recipe = build(tiny_dataset, variant)
    batch = real_batch(tiny_dataset)
    padded = pad_batch(batch, budget_for(tiny_dataset.train, 16))
    plain, plain_loss, plain_grads = loss_and_gradients(recipe, batch)
    out, loss, grads = loss_and_gradients(recipe, padded)
    edges, graphs = batch.num_edges, batch.num_graphs
    np.testing.assert_allclose(out["predictions"][:graphs], plain["predictions"], rtol=1e-6)
    np.testing.assert_allclose(out["alpha"][0][:edges], plain["alpha"][0], rtol=1e-6)
    np.testing.assert_allclose(loss, plain_loss, rtol=1e-6)
    # atol: Net's bias gets a gradient that is 0 in exact arithmetic (the softmax does not
    # see a shift of every logit), and float32 leaves about 1e-5 of cancellation noise.
    for padded_grad, plain_grad in zip(grads, plain_grads, strict=True):
        np.testing.assert_allclose(padded_grad, plain_grad, rtol=1e-5, atol=1e-5)
    # What padding itself gives: logit 0 and prediction 0.
    assert (out["logits"][0].numpy()[edges:] == 0).all()
    assert (out["predictions"].numpy()[graphs:] == 0).all()


def far_graphs(num_features, count=4, distance=5.0):
    """Triangles whose every edge is ``distance`` long."""
    senders, receivers = np.array([0, 1, 2, 1, 2, 0]), np.array([1, 2, 0, 0, 1, 2])
    nodes = np.ones((3, num_features), np.float32)
    return [Graph(nodes, np.full((6, 1), distance), senders, receivers, 0.0) for _ in range(count)]


def test_padding_never_makes_a_nan_of_its_own(tiny_dataset):
    """Net weights where real logits are 90 - 5 = 85 (finite) but the padding's, at
    distance 0, would be 90 > 88.72, where float32's exp overflows."""
    recipe = build(tiny_dataset)
    model = recipe.model
    model.embed.kernel.assign(np.zeros(model.embed.kernel.shape, np.float32))
    model.embed.bias.assign(np.zeros(model.embed.bias.shape, np.float32))
    net = model.passes[0].net
    kernel = np.zeros(net.kernel.shape, np.float32)
    kernel[-1] = -1.0  # the weight on e
    net.kernel.assign(kernel)
    net.bias.assign([90.0])
    batch = batch_graphs(far_graphs(tiny_dataset.num_features), targets=np.zeros(4))
    padded = pad_batch(batch, Budget(nodes=32, edges=64, graphs=8))
    signature = input_signature(tiny_dataset.num_features, "float32", padded=True)
    step = make_train_step(recipe, signature, guard=True)
    report = StepReport.of(step(padded.as_inputs(), padded.targets))
    assert report.ok, f"padding went non-finite: flags {report.flags}"
    assert report.stat("max_abs_logit") == pytest.approx(85.0)
    # Guards the test: without the mask, the same padding overflows.
    unmasked = {k: tf.constant(v) for k, v in padded.as_inputs().items() if "mask" not in k}
    logits = model.forward(unmasked)["logits"][0].numpy()
    assert logits.max() == pytest.approx(90.0)
    assert not np.isfinite(model.forward(unmasked)["alpha"][0].numpy()).all()


def untimed(result):
    return {k: v for k, v in result.row().items() if k not in TIMING_FIELDS}


def test_a_jit_run_repeats_itself_and_agrees_with_the_plain_run(tiny_dataset):
    config = TrainConfig(seed=0, batch_size=16, learning_rate=1e-2, epochs=3, hidden=8)
    runs = [
        Trainer(get_variant("raw_e"), tiny_dataset, replace(config, jit_compile=jit)).run()
        for jit in (True, True, False)
    ]
    assert untimed(runs[0]) == untimed(runs[1])
    assert runs[0].history_rows() == runs[1].history_rows()
    # XLA fuses ops and pads, so the numbers may differ in their last bits, no more.
    assert runs[0].best_mae == pytest.approx(runs[2].best_mae, rel=jit_agreement())


def test_a_jit_run_finds_and_names_the_same_first_nan(tiny_dataset):
    """The planted logit of 240 is beyond float32's exp, so the dtype is pinned."""
    planted = Variant("planted", "test-only", overflowing_attention)
    rows = []
    for jit in (True, False):
        config = TrainConfig(
            seed=0, batch_size=16, epochs=2, hidden=8, dtype="float32", jit_compile=jit
        )
        result = Trainer(planted, tiny_dataset, config).run()
        rows.append({k: v for k, v in untimed(result).items() if k.startswith("first_nan")})
    assert rows[0]["first_nan_where"] == "forward"
    assert rows[0] == rows[1]
