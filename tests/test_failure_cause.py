"""The failure cause (issue 21): planted failures of each kind are told apart, and an
optimizer update that goes non-finite is replayed op by op to name its slot and weight.

Every planted magnitude is chosen against float32's lines: exp overflows above 88.72, a
segment whose every exp flushes to 0 below -87.34 divides 0/0, and g * g overflows for
|g| above sqrt(3.4e38) = 1.84e19."""

import dataclasses

import keras
import numpy as np
import pytest
import tensorflow as tf
from test_replay import attention_weight_on_e

from stability import BuildContext, Recipe, TrainConfig, Trainer, Variant, create_recipe
from stability.core.failures import CAUSES
from stability.data import load_dataset
from stability.model.losses import robust_loss
from stability.train.cause import explosion_threshold, failure_cause
from stability.train.site import NanSite, OpEvidence, evidence_from, what_happened

CONFIG = TrainConfig(seed=0, batch_size=16, learning_rate=1e-2, epochs=2, hidden=8, dtype="float32")
THRESHOLD = explosion_threshold("float32")


def run(build, dataset, **overrides):
    config = dataclasses.replace(CONFIG, **overrides)
    return Trainer(Variant("planted", "test-only", build), dataset, config).run()


def scaled_loss(scale):
    """The seed's loss times ``scale``: the gradients grow by ``scale``, the forward pass
    and the loss stay finite."""

    def loss(targets, predictions):
        return robust_loss(targets, predictions) * scale

    return loss


def exploding(optimizer, scale=1e22):
    def build(ctx: BuildContext) -> Recipe:
        recipe = create_recipe(ctx, loss=scaled_loss(scale))
        return dataclasses.replace(recipe, optimizer=optimizer())

    return build


# --- forward: the seed's two directions are asserted in test_replay.py -------------------------


def test_a_finite_run_has_cause_none(tiny_dataset):
    result = run(attention_weight_on_e(0.1), tiny_dataset, epochs=1)
    assert result.first_nan_epoch is None
    assert result.failure_cause == "none"


# --- the update: a gradient explosion, named by its slot --------------------------------


@pytest.mark.parametrize(
    ("optimizer", "slot"),
    [
        (lambda: keras.optimizers.Adam(1e-2), "second moment (velocity)"),
        (lambda: keras.optimizers.AdamW(1e-2), "second moment (velocity)"),
        (lambda: keras.optimizers.RMSprop(1e-2), "second moment (velocity)"),
    ],
    ids=["Adam", "AdamW", "RMSprop"],
)
def test_a_gradient_whose_square_overflows_is_a_gradient_explosion(tiny_dataset, optimizer, slot):
    result = run(exploding(optimizer), tiny_dataset)
    assert (result.first_nan_epoch, result.first_nan_step) == (1, 1)
    assert result.first_nan_where == "weights"
    assert result.failure_cause == "gradient explosion"
    assert f": Square (Square) overflow in the {slot} of " in result.first_nan_op
    assert result.failure_max_abs_grad >= THRESHOLD
    # The failure record names the slot and the weight, whose own largest |g| is beyond
    # sqrt(max) too; the op text renders the same figure.
    failure = result.failure
    assert failure.slot == "velocity" and failure.weight in failure.op
    largest = failure.weight_max_abs_grad
    assert THRESHOLD <= largest <= result.failure_max_abs_grad * 1.001
    assert f"max |g| {largest:.3g}" in result.first_nan_op


def test_sgd_momentum_overflowing_its_slot_is_a_gradient_explosion(tiny_dataset):
    """SGD squares nothing: with a learning rate of 1e20, lr * g overflows its momentum buffer."""
    result = run(exploding(lambda: keras.optimizers.SGD(1e20, momentum=0.9), 1e25), tiny_dataset)
    assert result.first_nan_where == "weights"
    assert result.failure_cause == "gradient explosion"
    assert " in the slot 'momentum' of " in result.first_nan_op
    assert result.first_nan_op.startswith("SGD update: Mul")


class SquaredStepSGD(keras.optimizers.Optimizer):
    """A user's optimizer: steps by lr * g * |g| (a made-up rule whose square overflows)."""

    def update_step(self, gradient, variable, learning_rate):
        lr = keras.ops.cast(learning_rate, variable.dtype)
        self.assign_sub(variable, lr * keras.ops.multiply(gradient, keras.ops.abs(gradient)))


def test_a_users_optimizer_in_a_recipe_is_replayed_too(tiny_dataset):
    result = run(exploding(lambda: SquaredStepSGD(1e-2, name="squared_step")), tiny_dataset)
    assert result.first_nan_where == "weights"
    assert result.failure_cause == "gradient explosion"
    assert result.first_nan_op.startswith("SquaredStepSGD update: Mul")
    assert " in the update of " in result.first_nan_op


class ZeroGradientBias(keras.layers.Layer):
    """Adds 0 * b: b gets a gradient of exactly 0 at every step."""

    def build(self, input_shape):
        self.b = self.add_weight(shape=(input_shape[-1],), initializer="ones", name="b")

    def call(self, x):
        return x + 0.0 * self.b


class ZeroGradientModel(keras.Model):
    def __init__(self, num_features, hidden):
        super().__init__()
        self.embed = keras.layers.Dense(hidden, name="embed")
        self.dead = ZeroGradientBias(name="dead")
        self.head = keras.layers.Dense(2, name="head")
        self.embed.build((None, num_features))
        self.dead.build((None, hidden))
        self.head.build((None, hidden))

    def call(self, inputs, training=False):
        nodes = self.dead(self.embed(inputs["nodes"]))
        pooled = tf.math.unsorted_segment_sum(nodes, inputs["node_graph"], inputs["num_graphs"])
        return self.head(pooled)


def test_epsilon_zero_on_a_zero_gradient_is_an_optimizer_failure(tiny_dataset):
    """Adam with epsilon=0: m = v = 0 for a weight whose gradient is 0, so m / sqrt(v) = 0/0."""

    def build(ctx: BuildContext) -> Recipe:
        model = ZeroGradientModel(ctx.num_features, ctx.hidden)
        return Recipe(model, keras.optimizers.Adam(1e-2, epsilon=0.0))

    result = run(build, tiny_dataset)
    assert (result.first_nan_step, result.first_nan_where) == (1, "weights")
    assert result.failure_cause == "optimizer"
    assert result.first_nan_layer == "dead"
    assert result.first_nan_op.startswith("Adam update: ")
    assert " 0/0 in the update of dead/b" in result.first_nan_op
    assert "max |g| 0" in result.first_nan_op


def test_an_update_failure_late_in_an_epoch_is_replayed_from_the_state_before_it(tiny_dataset):
    """The replay rebuilds the state before the failing step from the epoch's start: a
    gradient that only explodes at the third step is named at the third step."""

    class LateScale(keras.layers.Layer):
        def build(self, input_shape):
            self.steps = self.add_weight(shape=(), initializer="zeros", trainable=False)

        def call(self, x, training=False):
            if training:
                self.steps.assign_add(1.0)
            # x * 1 for two steps, then x * 1e22: the gradient explodes at step 3.
            return x * tf.where(self.steps >= 3.0, 1e22, 1.0)

    class LateModel(keras.Model):
        def __init__(self, num_features, hidden):
            super().__init__()
            self.embed = keras.layers.Dense(hidden, name="embed")
            self.scale = LateScale(name="late_scale")
            self.head = keras.layers.Dense(1, name="head")
            self.embed.build((None, num_features))
            self.scale.build((None, hidden))
            self.head.build((None, hidden))

        def call(self, inputs, training=False):
            nodes = self.embed(inputs["nodes"])
            pooled = tf.math.unsorted_segment_sum(nodes, inputs["node_graph"], inputs["num_graphs"])
            return self.scale(self.head(pooled), training=training)

    def build(ctx: BuildContext) -> Recipe:
        return Recipe(
            LateModel(ctx.num_features, ctx.hidden),
            keras.optimizers.Adam(1e-2),
            loss=lambda t, p: tf.reduce_mean(tf.abs(p[:, 0] - t)),
        )

    result = run(build, tiny_dataset)
    assert (result.first_nan_epoch, result.first_nan_step) == (1, 3)
    assert result.failure_cause == "gradient explosion"
    assert "Square (Square) overflow in the second moment (velocity) of" in result.first_nan_op


# --- the seed's "gradient exploding problem" that is one ---------------------------------


def test_stable_softmax_on_outliers_up_to_1000_is_a_gradient_explosion_in_embed():
    """Issue 21's measurement: the stable softmax keeps the forward pass finite at edge
    distances up to 1000, but the gradient reaching ``embed`` exceeds sqrt(max)."""
    from stability import get_variant

    data = load_dataset(
        "generated",
        seed=0,
        num_graphs=200,
        distribution="outliers",
        min_distance=0.5,
        max_distance=4.0,
        max_outlier=1000.0,
    )
    config = dataclasses.replace(CONFIG, batch_size=32, hidden=16, epochs=1)
    result = Trainer(get_variant("stable_softmax"), data, config).run()
    assert result.failure_cause == "gradient explosion"
    assert result.first_nan_layer == "embed"
    assert result.failure_max_abs_grad >= THRESHOLD
    # The global norm is at least the largest entry: computed in float64, it did not overflow.
    assert result.failure_grad_norm >= result.failure_max_abs_grad
    assert "max |g| " in result.first_nan_op


# --- the rule itself, on planted evidence ------------------------------------------------


def evidence(op, nan=False, inf=False, zero=False):
    return OpEvidence(op, nan, inf, True, zero)


@pytest.mark.parametrize(
    ("kind", "site", "expected"),
    [
        (None, None, "none"),
        ("input", NanSite("input"), "input"),
        ("normalization", NanSite("forward"), "normalization"),
        ("masked_gradient", NanSite("gradient"), "masked gradient"),
        (
            "nonfinite",
            NanSite("forward", None, "Exp (e)", evidence("Exp", inf=True)),
            "forward overflow",
        ),
        (
            "nonfinite",
            NanSite("forward", None, "RealDiv (d)", evidence("RealDiv", nan=True, zero=True)),
            "forward underflow (0/0)",
        ),
        ("nonfinite", NanSite("forward", None, "Log (l)", evidence("Log", nan=True)), "forward"),
        ("nonfinite", NanSite("validation", None, "Exp (e)"), "forward overflow"),
        ("nonfinite", NanSite("loss", None, "Exp (e)"), "loss"),
        (
            "nonfinite",
            NanSite("gradient", None, "Mul", evidence("Mul", inf=True)),
            "gradient explosion",
        ),
        (
            "nonfinite",
            NanSite("gradient", None, "SqrtGrad", evidence("SqrtGrad", inf=True, zero=True)),
            "non-finite gradient op",
        ),
        (
            "nonfinite",
            NanSite("gradient", None, "Mul", evidence("Mul", nan=True)),
            "non-finite gradient op",
        ),
        (
            "nonfinite",
            NanSite("gradient", None, "XLA only (finite without XLA)"),
            "non-finite gradient op",
        ),
        (
            "nonfinite",
            NanSite("weights", None, "Adam update", max_abs_grad=2e19),
            "gradient explosion",
        ),
        ("nonfinite", NanSite("weights", None, "Adam update", max_abs_grad=1e19), "optimizer"),
    ],
)
def test_the_rule(kind, site, expected):
    assert expected in CAUSES
    assert failure_cause(kind, site) == expected


def test_the_explosion_line_follows_the_dtype():
    assert (
        failure_cause("nonfinite", NanSite("weights", max_abs_grad=1e30), "float64") == "optimizer"
    )
    assert explosion_threshold("float64") == pytest.approx(1.34e154, rel=1e-3)


def test_evidence_reads_a_zero_denominator_only_where_the_output_is_not_finite():
    nan_out = np.array([np.nan, 1.0])
    assert evidence_from(
        "RealDiv", [np.array([0.0, 1.0]), np.array([0.0, 1.0]), nan_out], 1
    ).zero_denominator
    finite_zero = evidence_from(
        "RealDiv", [np.array([1.0, 0.0]), np.array([np.inf, 0.0]), np.array([0.0, np.nan])], 1
    )
    assert finite_zero.zero_denominator and not finite_zero.inputs_finite
    assert not evidence_from(
        "RealDiv", [np.array([1.0]), np.array([1e-30]), np.array([np.inf])], 1
    ).zero_denominator


@pytest.mark.parametrize(
    ("evidence", "words"),
    [
        (OpEvidence("Square", False, True, True, False), "overflow"),
        (OpEvidence("RealDiv", True, False, True, True), "0/0"),
        (OpEvidence("RealDiv", False, True, True, True), "division by 0"),
        (OpEvidence("Sub", True, False, False, False), "inf - inf"),
        (OpEvidence("Mul", True, False, False, False), "fed a non-finite value"),
        (OpEvidence("Log", True, False, True, False), "NaN"),
    ],
)
def test_what_an_update_op_did_is_worded_from_its_values(evidence, words):
    assert what_happened(evidence) == words


@pytest.mark.parametrize("where", ["forward", "loss", "gradient", "weights", "validation", ""])
def test_an_older_rows_cause_is_always_in_the_vocabulary(where):
    """A row without ``failure_cause`` (an older CSV) is read by its stage: whatever the
    stage, the cause is one of CAUSES, never the stage's own name."""
    from stability.core.failures import failure_cause as read_cause

    row = {"first_nan_epoch": 3, "first_nan_where": where, "first_nan_op": "MatMul (dense)"}
    assert read_cause(row) in CAUSES
    if where in ("gradient", "weights", "validation"):
        assert read_cause(row) != where
