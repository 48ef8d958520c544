"""Planted failures of every kind, through the public API: each names epoch, step, stage,
layer and op. The two silent kinds (an overflowing denominator, a guarded 0/0) stay finite
everywhere; only the attention normalization invariant sees them."""

import keras
import numpy as np
import pytest
import tensorflow as tf

from stability import (
    BuildContext,
    Recipe,
    TrainConfig,
    Trainer,
    Variant,
    create_recipe,
    get_variant,
    load_dataset,
)
from stability.model.losses import robust_loss

CONFIG = TrainConfig(seed=0, batch_size=16, learning_rate=1e-2, epochs=2, hidden=8, dtype="float32")


#: The planted variants, by name. They are ``Variant`` objects of the public API, like the
#: ones ``register_variant`` makes, but kept out of the global registry, so that no other
#: test module sees them among the built-in variants.
PLANTED: dict[str, Variant] = {}


def register_variant(fn=None, *, name=None):
    """``stability.register_variant``'s signature, into ``PLANTED``."""

    def decorate(builder):
        key = name or builder.__name__
        PLANTED[key] = Variant(key, (builder.__doc__ or "").strip(), builder)
        return builder

    return decorate(fn) if fn is not None else decorate


def train(variant_name, dataset, **overrides):
    config = TrainConfig(**{**CONFIG.__dict__, **overrides})
    variant = PLANTED.get(variant_name) or get_variant(variant_name)
    trainer = Trainer(variant, dataset, config)
    return trainer.run()


def where(result):
    return (
        result.first_nan_epoch,
        result.first_nan_step,
        result.first_nan_where,
        result.first_nan_layer,
    )


# --- a user's attention model, written against the forward contract (docs/plugins.md) ---


def overflowing_denominator(logits, receivers, num_nodes):
    """exp / sum exp as written: every exp(88.5) = 2.7e38 is finite, two of them sum to inf."""
    exp = tf.exp(logits)
    return exp / tf.gather(tf.math.unsorted_segment_sum(exp, receivers, num_nodes), receivers)


def guarded_division(logits, receivers, num_nodes):
    """A "denominator > 0" guard: where every exp underflows to 0, the weights are 0, not NaN."""
    exp = tf.exp(logits)
    denominator = tf.gather(tf.math.unsorted_segment_sum(exp, receivers, num_nodes), receivers)
    return tf.math.divide_no_nan(exp, denominator)


def masked_poisoned(logits, receivers, num_nodes):
    """A masked softmax: the first edge of each batch is masked out as exp * 0, but its exp
    overflows, and inf * 0 = NaN poisons its segment."""
    mask = tf.cast(tf.range(tf.shape(logits)[0]) > 0, logits.dtype)[:, None]
    exp = tf.exp(logits + 100.0 * (1.0 - mask)) * mask
    return exp / tf.gather(tf.math.unsorted_segment_sum(exp, receivers, num_nodes), receivers)


SOFTMAXES = {
    "overflowing_denominator": overflowing_denominator,
    "guarded_division": guarded_division,
    "masked_poisoned": masked_poisoned,
}


class UserAttention(keras.layers.Layer):
    """Attention logits that start at ``level`` on every edge, normalized by ``softmax``."""

    def __init__(self, hidden, softmax, level, **kwargs):
        super().__init__(**kwargs)
        self.softmax, self.level = softmax, level
        self.score = keras.layers.Dense(1, name="score", kernel_initializer="zeros")
        self.message = keras.layers.Dense(hidden, name="message")

    def build(self, input_shape=None):
        self.score.build((None, self.message.units))
        self.message.build((None, self.message.units))
        self.score.bias.assign([self.level])

    def call(self, nodes, senders, receivers):
        sent = tf.gather(nodes, senders)
        logits = self.score(sent)
        alpha = SOFTMAXES[self.softmax](logits, receivers, tf.shape(nodes)[0])
        updated = nodes + tf.math.unsorted_segment_sum(
            alpha * self.message(sent), receivers, tf.shape(nodes)[0]
        )
        return updated, logits, alpha


class UserAttentionModel(keras.Model):
    def __init__(self, num_features, hidden, softmax, level):
        super().__init__()
        self.embed = keras.layers.Dense(hidden, name="embed")
        self.attention = UserAttention(hidden, softmax, level, name="user_attention")
        self.head = keras.layers.Dense(2, name="head")
        self.embed.build((None, num_features))
        self.attention.build()
        self.head.build((None, hidden))

    def forward(self, inputs, training=False):
        nodes = self.embed(inputs["nodes"])
        nodes, logits, alpha = self.attention(nodes, inputs["senders"], inputs["receivers"])
        pooled = tf.math.unsorted_segment_sum(nodes, inputs["node_graph"], inputs["num_graphs"])
        return {
            "predictions": self.head(pooled),
            "logits": [logits],
            "alpha": [alpha],
            "receivers": [inputs["receivers"]],
            "attention_layers": ["user_attention"],
        }

    def call(self, inputs, training=False):
        return self.forward(inputs, training)["predictions"]


def user_attention_variant(softmax, level):
    def build(ctx: BuildContext) -> Recipe:
        model = UserAttentionModel(ctx.num_features, ctx.hidden, softmax, level)
        return Recipe(model, keras.optimizers.Adam(ctx.learning_rate))

    return build


register_variant(user_attention_variant("overflowing_denominator", 88.5), name="planted_inf_den")
register_variant(user_attention_variant("guarded_division", -100.0), name="planted_guarded_0")
register_variant(user_attention_variant("masked_poisoned", 0.0), name="planted_masked")


def test_an_overflowing_denominator_is_a_forward_failure(tiny_dataset):
    result = train("planted_inf_den", tiny_dataset)
    assert where(result) == (1, 1, "forward", "user_attention")
    assert result.failure_kind == "normalization"
    assert result.first_nan_op.startswith("softmax normalization: weights sum to 0 ")
    assert result.final_mae is None


def test_a_guarded_zero_over_zero_is_a_forward_failure(tiny_dataset):
    result = train("planted_guarded_0", tiny_dataset)
    assert where(result) == (1, 1, "forward", "user_attention")
    assert result.failure_kind == "normalization"
    assert "weights sum to 0 " in result.first_nan_op


def test_masked_entry_poisoning_is_a_forward_failure(tiny_dataset):
    result = train("planted_masked", tiny_dataset)
    assert where(result) == (1, 1, "forward", "user_attention")
    assert result.failure_kind == "nonfinite"
    assert result.first_nan_op.startswith("Exp "), "the masked entry's exp overflows first"


# --- the harness's own model, planted --------------------------------------------------


@register_variant
def planted_overflow(ctx: BuildContext) -> Recipe:
    """raw_e with Net's weight on e at 60: logits of 4 * 60 = 240 overflow exp."""
    recipe = create_recipe(ctx)
    kernel = np.zeros(recipe.model.passes[0].net.kernel.shape, np.float32)
    kernel[-1] = 60.0
    recipe.model.passes[0].net.kernel.assign(kernel)
    return recipe


@register_variant
def planted_loss(ctx: BuildContext) -> Recipe:
    """log sigma = -100: exp(-log sigma) overflows in the loss alone."""
    recipe = create_recipe(ctx)
    recipe.model.head.bias.assign([0.0, -100.0])
    return recipe


def sqrt_of_zero_loss(y_true, y_pred):
    # sqrt(|x - x|) is 0 forward, but its gradient is inf * 0 = NaN.
    return robust_loss(y_true, y_pred) + tf.reduce_sum(tf.sqrt(tf.abs(y_pred - y_pred)))


@register_variant
def planted_gradient(ctx: BuildContext) -> Recipe:
    """A loss term with a NaN gradient."""
    return create_recipe(ctx, loss=sqrt_of_zero_loss)


def zero_nonfinite(gradients):
    """The common "fix": non-finite gradients replaced by 0."""
    return [tf.where(tf.math.is_finite(g), g, tf.zeros_like(g)) for g in gradients]


@register_variant
def planted_masking_transform(ctx: BuildContext) -> Recipe:
    """A NaN gradient that the gradient transform turns into zeros."""
    return create_recipe(ctx, loss=sqrt_of_zero_loss, gradient_transform=zero_nonfinite)


def infinite_scale(gradients):
    """A transform that makes finite gradients infinite: 1e30 * 1e30 overflows float32."""
    return [g * 1e30 * 1e30 for g in gradients]


@register_variant
def planted_bad_transform(ctx: BuildContext) -> Recipe:
    """Finite gradients, an infinite transform."""
    return create_recipe(ctx, gradient_transform=infinite_scale)


@register_variant
def planted_weights(ctx: BuildContext) -> Recipe:
    """A NaN learning rate: finite forward, loss and gradients, NaN weights after the update."""
    recipe = create_recipe(ctx)
    recipe.optimizer.learning_rate.assign(np.nan)
    return recipe


class SqrtOfZero(keras.layers.Layer):
    """x + sqrt(|x - x|): x forward, but the gradient of sqrt at 0 is inf, times 0: NaN."""

    def call(self, x):
        return x + tf.sqrt(tf.abs(x - x))


class GradientInALayer(keras.Model):
    def __init__(self, num_features, hidden):
        super().__init__()
        self.embed = keras.layers.Dense(hidden, name="embed")
        self.planted = SqrtOfZero(name="sqrt_of_zero")
        self.head = keras.layers.Dense(2, name="head")
        self.embed.build((None, num_features))
        self.head.build((None, hidden))

    def call(self, inputs, training=False):
        nodes = self.planted(self.embed(inputs["nodes"]))
        pooled = tf.math.unsorted_segment_sum(nodes, inputs["node_graph"], inputs["num_graphs"])
        return self.head(pooled)


@register_variant
def planted_layer_gradient(ctx: BuildContext) -> Recipe:
    """A NaN gradient inside a layer, finite forward."""
    return Recipe(GradientInALayer(ctx.num_features, ctx.hidden), keras.optimizers.Adam(1e-3))


def one_nan(kernel):
    """A kernel constraint that writes NaN into one element: the rest stays finite, which
    a max over the weights under XLA (it drops NaN) would miss."""
    return tf.tensor_scatter_nd_update(kernel, [[0, 0]], tf.constant([np.nan], kernel.dtype))


@register_variant
def planted_one_weight(ctx: BuildContext) -> Recipe:
    """Finite gradients; the update's constraint writes NaN into one weight of Net."""
    return create_recipe(ctx, net_kernel_constraint=one_nan)


class LogWhenPredicting(keras.layers.Layer):
    """Adds log(0) = -inf when called with training=False: fine in training, not in validation."""

    def call(self, x, training=False):
        return x if training else x + tf.math.log(tf.zeros_like(x))


class EvalOnlyFailure(keras.Model):
    """A model with only ``call``, that fails outside training."""

    def __init__(self, num_features, hidden):
        super().__init__()
        self.embed = keras.layers.Dense(hidden, name="embed")
        self.head = keras.layers.Dense(2, name="head")
        self.planted = LogWhenPredicting(name="eval_log")
        self.embed.build((None, num_features))
        self.head.build((None, hidden))

    def call(self, inputs, training=False):
        nodes = self.embed(inputs["nodes"])
        pooled = tf.math.unsorted_segment_sum(nodes, inputs["node_graph"], inputs["num_graphs"])
        return self.planted(self.head(pooled), training=training)


@register_variant
def planted_validation(ctx: BuildContext) -> Recipe:
    """Healthy in training, -inf predictions in validation."""
    return Recipe(EvalOnlyFailure(ctx.num_features, ctx.hidden), keras.optimizers.Adam(1e-3))


def test_forward_overflow_names_the_softmax(tiny_dataset):
    result = train("planted_overflow", tiny_dataset)
    assert where(result) == (1, 1, "forward", "message_passing_0")
    assert result.failure_kind == "nonfinite"
    assert "softmax" in result.first_nan_op


def test_loss_overflow_is_named_loss(tiny_dataset):
    result = train("planted_loss", tiny_dataset)
    assert where(result)[:3] == (1, 1, "loss")
    assert result.first_nan_op.startswith("Exp ")


def test_a_gradient_is_named_by_its_forward_op(tiny_dataset):
    result = train("planted_gradient", tiny_dataset)
    assert where(result)[:3] == (1, 1, "gradient")
    assert result.first_nan_op.startswith("Sqrt (Sqrt) gradient"), result.first_nan_op
    assert result.failure_kind == "nonfinite"


def test_a_gradient_in_a_layer_names_the_layer_and_its_forward_op(tiny_dataset):
    result = train("planted_layer_gradient", tiny_dataset)
    assert where(result) == (1, 1, "gradient", "sqrt_of_zero")
    assert result.first_nan_op == "Sqrt (Sqrt) gradient: SqrtGrad"


def test_a_transform_that_masks_a_nan_gradient_is_a_gradient_failure(tiny_dataset):
    result = train("planted_masking_transform", tiny_dataset)
    assert where(result)[:3] == (1, 1, "gradient")
    assert result.failure_kind == "masked_gradient"
    assert result.first_nan_op.startswith("Sqrt (Sqrt) gradient")
    assert result.first_nan_op.endswith("masked by gradient transform zero_nonfinite")


def test_a_transform_that_makes_gradients_infinite_is_named(tiny_dataset):
    result = train("planted_bad_transform", tiny_dataset)
    assert where(result) == (1, 1, "gradient", None)
    assert result.first_nan_op.startswith("Mul ")
    assert result.first_nan_op.endswith("in gradient transform infinite_scale")


@pytest.mark.parametrize("jit_compile", [False, True])
def test_an_update_that_writes_nan_is_named_weights(tiny_dataset, jit_compile):
    result = train("planted_weights", tiny_dataset, jit_compile=jit_compile)
    assert where(result)[:3] == (1, 1, "weights")
    assert result.first_nan_layer is not None
    # The NaN was in the optimizer's state before the update: no op of it made the NaN.
    assert result.first_nan_op == "Adam update: adam/learning_rate was not finite before the step"
    assert result.failure_cause == "optimizer"


@pytest.mark.parametrize("jit_compile", [False, True])
def test_one_nan_weight_among_finite_ones_is_named(tiny_dataset, jit_compile):
    result = train("planted_one_weight", tiny_dataset, jit_compile=jit_compile)
    assert where(result) == (1, 1, "weights", "message_passing_0/net")


def test_a_nonfinite_validation_prediction_is_a_validation_failure(tiny_dataset):
    result = train("planted_validation", tiny_dataset)
    steps_per_epoch = -(-len(tiny_dataset.train) // CONFIG.batch_size)
    assert where(result) == (1, steps_per_epoch, "validation", "eval_log")
    assert result.first_nan_op.startswith("Log ")
    assert result.failure_kind == "nonfinite"
    assert result.final_mae is None


# --- false alarms -----------------------------------------------------------------------


@pytest.mark.parametrize("variant", ["stable_softmax", "normalized_e", "no_e"])
def test_stable_variants_on_extreme_generated_data_raise_no_flag(variant):
    data = load_dataset(
        "generated", seed=1, num_graphs=64, distribution="outliers", max_outlier=40.0
    )
    result = train(variant, data, epochs=3, learning_rate=3e-2)
    assert not result.hit_nan, (result.failure_kind, result.first_nan_where, result.first_nan_op)
    assert result.failure_kind is None


# --- headroom: finite runs near exp's limits get a warning ------------------------------


def logits_at(level: float, softmax: str = "naive"):
    """The seed's model with every attention logit starting at ``level`` (Net's bias)."""

    def build(ctx: BuildContext) -> Recipe:
        recipe = create_recipe(ctx, softmax=softmax)
        net = recipe.model.passes[0].net
        net.kernel.assign(np.zeros(net.kernel.shape, np.float32))
        net.bias.assign([level])
        return recipe

    return build


for _level in (82.0, -82.0, 46.0, 20.0):
    register_variant(logits_at(_level), name=f"planted_logits_{_level:+.0f}")
register_variant(logits_at(82.0, "stable"), name="planted_logits_stable_+82")


@pytest.mark.parametrize(
    ("variant", "jit_compile", "expected"),
    [
        ("planted_logits_+82", False, "within 10% of the float32 overflow line 88.72"),
        ("planted_logits_-82", False, "within 10% of the float32 underflow line -87.34"),
        ("planted_logits_+46", True, "half the float32 overflow line: XLA's softmax gradient"),
        ("planted_logits_+46", False, None),
        ("planted_logits_+20", False, None),
        ("planted_logits_stable_+82", False, None),
    ],
)
def test_a_finite_run_near_a_limit_gets_a_warning(tiny_dataset, variant, jit_compile, expected):
    result = train(variant, tiny_dataset, epochs=1, learning_rate=1e-4, jit_compile=jit_compile)
    assert not result.hit_nan, (result.first_nan_where, result.first_nan_op)
    if expected is None:
        assert result.warning is None, result.warning
    else:
        assert expected in (result.warning or ""), result.warning
    level = float(variant.rsplit("_", 1)[1])
    if "stable" in variant:
        assert (result.max_exp_arg, result.min_node_max_logit) == (0.0, 0.0)
    elif level > 0:
        assert result.max_exp_arg == pytest.approx(level, abs=0.1)
    else:
        assert result.min_node_max_logit == pytest.approx(level, abs=0.1)


def test_a_variant_from_the_real_registry_is_checked_alike(tiny_dataset):
    """The same plant through ``stability.register_variant``, as a plugin registers it.

    Registered here, at run time, not on import: the name then stays out of the variant
    lists that earlier test modules compare against (its name has no "_e" for the same
    reason: test_variants filters on it)."""
    import stability

    stability.register_variant(
        user_attention_variant("overflowing_denominator", 88.5), name="plantedregistry"
    )
    result = train("plantedregistry", tiny_dataset)
    assert where(result) == (1, 1, "forward", "user_attention")
    assert result.failure_kind == "normalization"
