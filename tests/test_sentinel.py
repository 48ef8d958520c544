"""The trainer's fused check catches a NaN in the loss, a gradient and the weights."""

import dataclasses
import math

import numpy as np
import pytest
import tensorflow as tf

from stability import BuildContext
from stability.model.losses import robust_loss
from stability.model.recipe import Variant
from stability.model.variants import create_recipe
from stability.train import guard
from stability.train.checks import nonfinite_weights
from stability.train.config import TrainConfig
from stability.train.forward import completed
from stability.train.guard import StepReport, stage_of
from stability.train.trainer import Trainer

# The planted magnitudes (logits of 240, log sigma of -100) are float32's limits; each
# policy's own limits are tested in test_dtype_policy.py.
CONFIG = TrainConfig(seed=0, batch_size=16, learning_rate=1e-2, epochs=2, hidden=8, dtype="float32")


def run(build, dataset, **overrides):
    config = TrainConfig(**{**CONFIG.__dict__, **overrides})
    trainer = Trainer(Variant("planted", "test-only", build), dataset, config)
    return trainer, trainer.run()


def overflowing_loss(ctx: BuildContext):
    """log sigma = -100 from the start: exp(-log sigma) overflows in the loss alone."""
    recipe = create_recipe(ctx)
    recipe.model.head.bias.assign([0.0, -100.0])
    return recipe


def nan_gradient_loss(y_true, y_pred):
    # sqrt(|x - x|) is 0 forward, but its gradient is inf * 0 = NaN.
    return robust_loss(y_true, y_pred) + tf.reduce_sum(tf.sqrt(tf.abs(y_pred - y_pred)))


def nan_gradient(ctx: BuildContext):
    return create_recipe(ctx, loss=nan_gradient_loss)


def nan_learning_rate(ctx: BuildContext):
    """Finite forward, loss and gradients, but the update writes NaN into every weight."""
    recipe = create_recipe(ctx)
    recipe.optimizer.learning_rate.assign(math.nan)
    return recipe


def overflowing_attention(ctx: BuildContext, weight: float = 60.0):
    """Net's weight on e set so that the attention logit reaches 4 * 60 = 240 > 88.72."""
    recipe = create_recipe(ctx)
    kernel = np.zeros(recipe.model.passes[0].net.kernel.shape, np.float32)
    kernel[-1] = weight
    recipe.model.passes[0].net.kernel.assign(kernel)
    return recipe


def finite_predictions_loss(y_true, y_pred):
    """The seed's loss over the predictions with every non-finite row replaced by 0.

    A select does no arithmetic on what it drops, so a NaN or inf prediction never reaches
    the loss, on any machine (a mask multiplied in would not do: NaN * 0 = NaN), and the
    gradient into a dropped row is exactly 0.
    """
    finite = tf.reduce_all(tf.math.is_finite(y_pred), axis=-1, keepdims=True)
    return robust_loss(y_true, tf.where(finite, y_pred, tf.zeros_like(y_pred)))


def overflowing_attention_behind_a_finite_loss(ctx: BuildContext):
    """The seed's overflow (``overflowing_attention``) trained on ``finite_predictions_loss``."""
    return dataclasses.replace(overflowing_attention(ctx), loss=finite_predictions_loss)


def test_nan_in_the_loss_is_named_loss(tiny_dataset):
    _, result = run(overflowing_loss, tiny_dataset)
    assert (result.first_nan_epoch, result.first_nan_step) == (1, 1)
    assert result.first_nan_where == "loss"
    assert result.loss_nan_epoch == 1


def test_nan_in_a_gradient_is_named_gradient(tiny_dataset):
    _, result = run(nan_gradient, tiny_dataset)
    assert result.first_nan_step == 1
    assert result.first_nan_where == "gradient"
    assert result.loss_nan_epoch is None, "the loss itself was finite"


def test_nan_written_by_the_update_is_named_weights(tiny_dataset):
    _, result = run(nan_learning_rate, tiny_dataset)
    assert result.first_nan_step == 1
    assert result.first_nan_where == "weights"
    assert result.first_nan_layer is not None
    assert result.loss_nan_epoch is None


def test_silent_case_weights_nan_while_loss_stays_finite(tiny_dataset):
    """The seed's overflow, trained on unguarded: the loss stays finite, the weights do not.

    The loss drops non-finite predictions with a select, so it stays finite by construction
    (the seed's model alone leaves that to its head's relu, and whether a relu maps NaN to
    0 depends on the CPU's kernel). The overflow is exp(240) = inf in float32 at step 1,
    and the unguarded update after it writes the NaN gradients into the weights.
    A check of the loss alone (Keras' TerminateOnNaN) never fires here; the sentinel fires
    at the very first step.
    """
    trainer, result = run(
        overflowing_attention_behind_a_finite_loss, tiny_dataset, stop_at_nan=False
    )
    assert (result.first_nan_epoch, result.first_nan_step) == (1, 1)
    assert result.first_nan_where == "forward"
    assert result.loss_nan_epoch is None, "the loss went non-finite; the case is not silent"
    assert all(np.isfinite(r.train_loss) for r in result.history)
    bad = nonfinite_weights(trainer.recipe.model.trainable_variables)
    assert bad, "the weights should have gone NaN behind a finite loss"


def test_guarded_run_keeps_the_last_finite_weights(tiny_dataset):
    trainer, result = run(overflowing_attention, tiny_dataset)
    assert result.first_nan_where == "forward"
    assert not nonfinite_weights(trainer.recipe.model.trainable_variables)


@pytest.mark.parametrize(
    ("forward", "normalized", "loss", "raw", "transformed", "weight", "expected"),
    [
        pytest.param(1.0, True, 1.0, 1.0, 1.0, 1.0, None, id="finite"),
        pytest.param(np.inf, False, np.nan, np.nan, np.nan, np.nan, "forward", id="forward"),
        pytest.param(1.0, False, 1.0, 1.0, 1.0, 1.0, "attention", id="attention"),
        pytest.param(1.0, True, np.inf, np.nan, np.nan, 1.0, "loss", id="loss"),
        pytest.param(1.0, True, 1.0, np.nan, 0.0, 1.0, "gradient", id="masked-gradient"),
        pytest.param(1.0, True, 1.0, 1.0, np.nan, 1.0, "transform", id="transform"),
        pytest.param(1.0, True, 1.0, 1.0, 1.0, np.nan, "weights", id="weights-loss-finite"),
    ],
)
def test_first_failure_follows_the_step_order(
    forward, normalized, loss, raw, transformed, weight, expected
):
    """The guard itself, on one-element tensors: the first failing check names the step."""
    out = completed(
        {
            "predictions": tf.constant([forward]),
            # One node with one incoming edge: weight 1 is normalized, 0.5 is not.
            "alpha": [tf.constant([1.0 if normalized else 0.5])],
            "receivers": [tf.constant([0])],
        }
    )
    before = guard.before_update(
        out, {}, tf.constant(loss), [tf.constant([raw])], [tf.constant([transformed])]
    )
    weights_ok, _ = guard.after_update([tf.Variable([weight])], [])
    report = StepReport.of(guard.report(before, weights_ok, tf.constant(1.0)).numpy())
    assert report.first_failure() == expected
    assert report.ok == (expected is None)
    if expected in ("attention", "transform"):
        assert stage_of(expected) == {"attention": "forward", "transform": "gradient"}[expected]


def test_unguarded_stable_softmax_stays_finite_under_the_same_plant(tiny_dataset):
    def planted_stable(ctx):
        recipe = overflowing_attention(ctx)
        stable = create_recipe(ctx, softmax="stable")
        stable.model.set_weights(recipe.model.get_weights())
        return stable

    _, result = run(planted_stable, tiny_dataset)
    assert not result.hit_nan, f"stable softmax hit a NaN: {result.first_nan_where}"
