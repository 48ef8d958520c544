"""Under a mixed policy ``run`` computes a model's loss as ``Model.fit`` does: Keras' compiled
loss converts float16 predictions to float32 before the loss function sees them, so the
trainer does too (``step.loss_predictions``), and a loss whose epsilon float16 cannot hold
fails in neither (issue 43). (``-log(1 - p + 1e-15)`` is no such loss: TensorFlow's graph
optimizer folds it into ``-log((1 + 1e-15) - p)``, which is ``-log(0)`` at ``p = 1`` in any
dtype, in ``run`` and ``fit`` alike.)"""

import keras
import numpy as np
import pytest
import tensorflow as tf

from stability import BuildContext
from stability.model.losses import loss_predictions
from stability.model.recipe import Recipe, Variant
from stability.train.config import TrainConfig
from stability.train.trainer import Trainer


def log_small(targets, predictions):
    """``-log(sigmoid(-x) + 1e-15)``, the log of a small probability kept off 0 by an
    epsilon: at ``x = 30``, sigmoid(-30) = 9.4e-14 and 1e-15 are both 0 in float16 (its
    least subnormal is 6e-8), so this loss is ``-log(0)`` there and 29.9 in float32."""
    small = tf.sigmoid(-predictions[:, 0])
    return tf.reduce_mean(-tf.math.log(small + 1e-15)) + 0.0 * tf.reduce_mean(targets)


class Float16Head(keras.Model):
    """Nodes embedded, averaged over each graph, and a head that keeps the policy's compute
    dtype (float16 under ``mixed_float16``: no ``dtype="float32"``) with its bias at 30."""

    def __init__(self, hidden):
        super().__init__()
        self.embed = keras.layers.Dense(hidden, activation="relu")
        self.head = keras.layers.Dense(2, bias_initializer=keras.initializers.Constant(30.0))

    def call(self, inputs):
        h = self.embed(inputs["nodes"])
        pooled = tf.math.unsorted_segment_mean(h, inputs["node_graph"], inputs["num_graphs"])
        return self.head(pooled)


def float16_head(ctx: BuildContext) -> Recipe:
    return Recipe(Float16Head(ctx.hidden), keras.optimizers.Adam(1e-3), log_small)


def test_float16_predictions_reach_a_loss_function_as_float32():
    p = tf.constant([[1.0]], tf.float16)
    assert loss_predictions(log_small, p).dtype == tf.float32
    # A keras Loss converts them to its own dtype when called: they are left alone.
    assert loss_predictions(keras.losses.MeanSquaredError(), p).dtype == tf.float16
    wide = tf.constant([[1.0]], tf.float64)
    assert loss_predictions(log_small, wide) is wide


def test_the_loss_differs_between_the_dtypes():
    """The test below could fail: on float16 predictions this loss is inf."""
    high = tf.constant([[30.0, 0.0]], tf.float16)
    assert not np.isfinite(log_small(tf.zeros([1], tf.float16), high).numpy())
    assert np.isfinite(log_small(tf.zeros([1]), tf.cast(high, tf.float32)).numpy())


@pytest.mark.parametrize("way", ["run", "fit"])
def test_run_and_fit_agree_on_a_float16_model(way, tiny_dataset):
    config = TrainConfig(seed=0, batch_size=16, epochs=1, hidden=8, dtype="mixed_float16")
    trainer = Trainer(Variant("float16_head", "test-only", float16_head), tiny_dataset, config)
    if way == "run":
        result = trainer.run()
        assert result.first_nan_epoch is None, result
        return
    from stability import NanSentinel, keras_input
    from stability.zoo.tools import HarnessLoss

    recipe = trainer.build()
    recipe.model.compile(recipe.optimizer, HarnessLoss(recipe.loss), auto_scale_loss=False)
    sentinel = NanSentinel(verbose=False)
    data = keras_input(tiny_dataset, "train", batch_size=16, seed=0)
    history = recipe.model.fit(data, epochs=1, verbose=0, callbacks=[sentinel])
    assert sentinel.result["first_nan_epoch"] is None, sentinel.result
    assert np.isfinite(history.history["loss"]).all()
