"""The replay names the layer and op of a step's first non-finite value."""

import keras
import numpy as np
import pytest
import tensorflow as tf
from test_sentinel import nan_gradient, overflowing_loss

from stability import BuildContext
from stability.model.recipe import Recipe, Variant
from stability.model.variants import create_recipe
from stability.train.config import TrainConfig
from stability.train.failing_op import site_from_error
from stability.train.trainer import Trainer

# The planted magnitudes (logits of 240, log sigma of -100) are float32's limits; each
# policy's own limits are tested in test_dtype_policy.py.
CONFIG = TrainConfig(seed=0, batch_size=16, learning_rate=1e-2, epochs=2, hidden=8, dtype="float32")


def run(build, dataset, **overrides):
    config = TrainConfig(**{**CONFIG.__dict__, **overrides})
    return Trainer(Variant("planted", "test-only", build), dataset, config).run()


def attention_weight_on_e(weight: float):
    """raw_e with Net's kernel zero except its weight on e: every logit is weight * e."""

    def build(ctx: BuildContext) -> Recipe:
        recipe = create_recipe(ctx)
        kernel = np.zeros(recipe.model.passes[0].net.kernel.shape, np.float32)
        kernel[-1] = weight
        recipe.model.passes[0].net.kernel.assign(kernel)
        return recipe

    return build


@keras.saving.register_keras_serializable(package="stability_tests")
class PlantedLog(keras.layers.Layer):
    """Adds log(0) = -inf to its input: a planted non-finite value in a head layer."""

    def call(self, x):
        return x + tf.math.log(tf.zeros_like(x))


class PlantedHeadModel(keras.Model):
    """A plain model over the GraphBatch inputs, with no ``forward`` method."""

    def __init__(self, num_features, hidden):
        super().__init__()
        self.embed = keras.layers.Dense(hidden, name="embed")
        self.head = keras.layers.Dense(2, name="head")
        self.planted = PlantedLog(name="planted_log")

    def call(self, inputs):
        nodes = self.embed(inputs["nodes"])
        pooled = tf.math.unsorted_segment_sum(nodes, inputs["node_graph"], inputs["num_graphs"])
        return self.planted(self.head(pooled))


def planted_head(ctx: BuildContext) -> Recipe:
    model = PlantedHeadModel(ctx.num_features, ctx.hidden)
    model.embed.build((None, ctx.num_features))
    model.head.build((None, ctx.hidden))
    return Recipe(model, keras.optimizers.Adam(ctx.learning_rate))


def test_overflow_in_the_attention_softmax_is_named_exp(tiny_dataset):
    result = run(attention_weight_on_e(60.0), tiny_dataset)  # logits up to 240 > 88.72
    assert result.first_nan_where == "forward"
    assert result.first_nan_layer == "message_passing_0"
    assert result.first_nan_op == "Exp (softmax_exp)"
    # Issue 21: the failing op returned inf: the cause is an overflow.
    assert result.failure_cause == "forward overflow"


def test_underflow_of_a_whole_segment_is_named_the_division(tiny_dataset):
    """Every logit below -87.3: exp flushes to 0 on this CPU and the softmax divides 0/0."""
    result = run(attention_weight_on_e(-200.0), tiny_dataset)  # logits <= -100
    assert result.first_nan_where == "forward"
    assert result.first_nan_layer == "message_passing_0"
    assert result.first_nan_op == "RealDiv (softmax_div)"
    # Issue 21: NaN where the division's denominator is 0: the underflow's 0/0.
    assert result.failure_cause == "forward underflow (0/0)"
    # The forward pass failed, so the failing step's gradients are not finite either.
    assert result.failure_max_abs_grad is None


def test_planted_log_zero_in_a_head_layer_is_named_that_layer(tiny_dataset):
    result = run(planted_head, tiny_dataset)
    assert (result.first_nan_where, result.first_nan_layer) == ("forward", "planted_log")
    assert result.first_nan_op.startswith("Log ")


def test_overflow_in_the_loss_is_named_loss(tiny_dataset):
    result = run(overflowing_loss, tiny_dataset)
    assert result.first_nan_where == "loss"
    assert result.first_nan_layer is None
    assert result.first_nan_op.startswith("Exp ")


def test_nan_first_in_a_gradient_is_named_gradient(tiny_dataset):
    result = run(nan_gradient, tiny_dataset)
    assert result.first_nan_where == "gradient"
    assert result.first_nan_op is not None


def test_unguarded_run_still_localizes_and_goes_on(tiny_dataset):
    result = run(attention_weight_on_e(60.0), tiny_dataset, stop_at_nan=False)
    assert result.first_nan_op == "Exp (softmax_exp)"
    assert len(result.history) == CONFIG.epochs, "stop_at_nan=False must train on"


@pytest.mark.parametrize(
    ("node", "expected"),
    [
        pytest.param("message_passing_0_1/softmax_exp", ("forward", "message_passing_0"), id="fw"),
        pytest.param("gradient_tape/head/MatMul", ("gradient", "head"), id="gradient"),
        pytest.param("stability_loss/Exp", ("loss", None), id="loss"),
        pytest.param("gradient_tape/stability_loss/Sqrt", ("gradient", None), id="loss-grad"),
    ],
)
def test_site_from_error_reads_scopes(node, expected):
    message = f'Detected at node {node}/CheckNumericsV2\n... of graph op "Exp" ...'
    site = site_from_error(message, {"message_passing_0", "head", "net"})
    assert (site.where, site.layer) == expected


def test_an_xla_compiled_step_is_guarded_and_replayed_without_xla(tiny_dataset):
    """The fused check and the guard work under jit_compile=True; the replay, whose check
    ops XLA cannot compile, runs without it and still names the op."""
    from stability.data.graphs import batch_graphs
    from stability.train.guard import StepReport
    from stability.train.replay import replay_step
    from stability.train.step import input_signature, make_train_step

    trainer = Trainer(
        Variant("planted", "test-only", attention_weight_on_e(60.0)), tiny_dataset, CONFIG
    )
    recipe = trainer.build()
    signature = input_signature(tiny_dataset.num_features, "float32")
    step = make_train_step(recipe, signature, guard=True, jit_compile=True)
    batch = batch_graphs(tiny_dataset.train[:16])
    before = [w.numpy().copy() for w in recipe.model.trainable_variables]
    report = StepReport.of(step(batch.as_inputs(), batch.targets))
    assert not report.passed("forward"), "the forward overflow must be seen under XLA"
    for old, new in zip(before, recipe.model.trainable_variables, strict=True):
        np.testing.assert_array_equal(old, new.numpy())
    inputs = {k: tf.constant(v) for k, v in batch.as_inputs().items()}
    site = replay_step(recipe.model, lambda p: recipe.loss(tf.constant(batch.targets), p), inputs)
    assert (site.where, site.op) == ("forward", "Exp (softmax_exp)")


class SincHead(keras.Model):
    """sin(d) / d of the first input column (0 at the first row: 0/0), then a Dense;
    ``guard``: through ``tf.where(d == 0, 1, ...)`` (the branch it discards), else a relu."""

    def __init__(self, guard: bool):
        super().__init__()
        self.guard, self.head = guard, keras.layers.Dense(1)

    def call(self, x):
        d = x[:, 0]
        sinc = tf.sin(d) / d
        y = tf.where(d == 0, tf.ones_like(d), sinc) if self.guard else tf.nn.relu(sinc)
        return self.head(y[:, None])


@pytest.mark.parametrize("guard", [True, False])
def test_a_nan_only_a_tf_where_discards_is_told_from_one_that_reaches_on(guard):
    from stability.train.replay import replay_step

    model = SincHead(guard)
    inputs = tf.constant([[0.0, 1.0], [2.0, 1.0]])
    model(inputs)
    site = replay_step(model, lambda predictions: tf.reduce_sum(predictions**2), inputs)
    assert site is not None and site.where == "forward" and site.op.startswith("RealDiv")
    # Only the discarded branch is selected away: a relu (which may drop NaN on some CPUs'
    # kernels, so the guard may see finite outputs) does not make it a gradient failure.
    assert site.selected is guard


class MaskedSoftmax(keras.layers.Layer):
    """A softmax over each graph's nodes with every node not of the first type masked by
    ``-inf``, the max of all logits subtracted: a graph with no node of that type sums
    exp(-inf) = 0 and divides 0 / 0 (pytorch/pytorch#55056's fully masked row).
    Shapes: ``logits`` ``[num_nodes, 1]``; returns ``[num_nodes, 1]``."""

    def call(self, logits, nodes, node_graph, num_graphs):
        masked = tf.where(nodes[:, :1] == 0.0, tf.fill(tf.shape(logits), -np.inf), logits)
        shift = tf.math.unsorted_segment_max(logits, node_graph, num_graphs)
        e = tf.exp(masked - tf.gather(shift, node_graph))
        total = tf.math.unsorted_segment_sum(e, node_graph, num_graphs)
        return e / tf.gather(total, node_graph)


class MaskedModel(keras.Model):
    def __init__(self, hidden):
        super().__init__()
        self.embed = keras.layers.Dense(hidden, name="embed")
        self.score = keras.layers.Dense(1, name="score")
        self.softmax = MaskedSoftmax(name="masked_softmax")
        self.head = keras.layers.Dense(2, name="head")

    def call(self, inputs):
        h = self.embed(inputs["nodes"])
        graph, count = inputs["node_graph"], inputs["num_graphs"]
        alpha = self.softmax(self.score(h), inputs["nodes"], graph, count)
        return self.head(tf.math.unsorted_segment_sum(alpha * h, graph, count))


def test_a_minus_inf_mask_is_not_the_failure_the_division_it_leads_to_is(tiny_dataset):
    """check_numerics stops at the mask's -inf constant (TensorFlow checks constants too);
    the replay names the op that made the first NaN from values that held none."""

    def masked(ctx: BuildContext) -> Recipe:
        return Recipe(MaskedModel(ctx.hidden), keras.optimizers.Adam(ctx.learning_rate))

    result = run(masked, tiny_dataset)
    assert result.first_nan_where == "forward", result
    assert result.first_nan_layer == "masked_softmax", result
    assert result.first_nan_op.startswith("RealDiv"), result
    assert result.failure_cause == "forward underflow (0/0)", result
