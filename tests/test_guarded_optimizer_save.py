"""``GuardedOptimizer`` saved and loaded (issue 44, item 8).

The wrapper serializes as Keras' ``LossScaleOptimizer`` does (the inner optimizer nested
under ``inner_optimizer``) and loads as the user's own optimizer: a model saved while
``NanSentinel`` watches loads with the user's optimizer and its state, and trains on.
"""

import json

import keras
import numpy as np
import pytest

from stability import NanSentinel
from stability.train.guarded_optimizer import GuardedOptimizer

BATCH, STEPS_PER_EPOCH = 8, 4
EPOCHS, SAVED_EPOCH = 3, 2  # the checkpoint loaded is the one written mid-fit


def data(seed=0):
    x = np.random.default_rng(seed).normal(size=(BATCH * STEPS_PER_EPOCH, 4)).astype("float32")
    return x, x.sum(axis=1, keepdims=True)


def user_optimizer():
    return keras.optimizers.Adam(learning_rate=0.003, beta_1=0.8, clipnorm=2.0)


def compiled_model():
    keras.utils.set_random_seed(0)
    model = keras.Sequential(
        [keras.Input((4,)), keras.layers.Dense(8, activation="relu"), keras.layers.Dense(1)]
    )
    model.compile(optimizer=user_optimizer(), loss="mse")
    return model


def values(variables):
    return [np.array(v.numpy()) for v in variables]


class AtEpochEnd(keras.callbacks.Callback):
    """What ``ModelCheckpoint`` saves at each epoch's end: the optimizer the model carries
    (the sentinel's wrapper), serialized as a callback would, and the state it saves."""

    def __init__(self, x):
        super().__init__()
        self.x, self.epochs = x, {}

    def on_epoch_end(self, epoch, logs=None):
        optimizer = self.model.optimizer
        self.epochs[epoch + 1] = {
            "wrapped": isinstance(optimizer, GuardedOptimizer),
            "serialized": json.dumps(keras.saving.serialize_keras_object(optimizer)),
            "iterations": int(optimizer.iterations.numpy()),
            "variables": values(optimizer.variables),
            "weights": self.model.get_weights(),
            "predictions": self.model(self.x, training=False).numpy(),
        }


def test_a_checkpoint_written_while_the_sentinel_watches_loads_with_the_users_optimizer(
    tmp_path,
):
    x, y = data()
    model, seen = compiled_model(), AtEpochEnd(x)
    expected_config = model.optimizer.get_config()
    checkpoint = keras.callbacks.ModelCheckpoint(tmp_path / "epoch{epoch}.keras")
    sentinel = NanSentinel(verbose=False)
    callbacks = [sentinel, checkpoint, seen]
    model.fit(x, y, batch_size=BATCH, epochs=EPOCHS, shuffle=False, verbose=0, callbacks=callbacks)
    assert sentinel.result["first_nan_epoch"] is None, sentinel.result
    saved = seen.epochs[SAVED_EPOCH]
    assert saved["wrapped"], "the sentinel did not wrap the optimizer: nothing is tested"
    assert saved["iterations"] == SAVED_EPOCH * STEPS_PER_EPOCH

    # The optimizer the model carried mid-fit, serialized, is the user's when deserialized.
    optimizer = keras.saving.deserialize_keras_object(json.loads(saved["serialized"]))
    assert type(optimizer) is keras.optimizers.Adam, type(optimizer)
    assert optimizer.get_config() == expected_config

    loaded = keras.saving.load_model(tmp_path / f"epoch{SAVED_EPOCH}.keras")
    assert type(loaded.optimizer) is keras.optimizers.Adam, type(loaded.optimizer)
    assert loaded.optimizer.get_config() == expected_config
    assert int(loaded.optimizer.iterations.numpy()) == saved["iterations"]
    # Every optimizer variable (the step count, the learning rate, Adam's moments), in order.
    names = [v.path for v in loaded.optimizer.variables]
    assert any("momentum" in n for n in names) and any("velocity" in n for n in names), names
    restored = values(loaded.optimizer.variables)
    assert len(restored) == len(saved["variables"]), names
    for name, got, want in zip(names, restored, saved["variables"], strict=True):
        np.testing.assert_array_equal(got, want, err_msg=name)
    # The checkpoint is the mid-fit state, not the model's state at the end of fit.
    assert not np.array_equal(restored[2], values(model.optimizer.variables)[2])
    for got, want in zip(loaded.get_weights(), saved["weights"], strict=True):
        np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(loaded(x, training=False).numpy(), saved["predictions"])

    # fit continues from the saved state, watched by a new sentinel, and then unwrapped.
    before = loaded.get_weights()
    again = NanSentinel(verbose=False)
    history = loaded.fit(
        x, y, batch_size=BATCH, epochs=1, shuffle=False, verbose=0, callbacks=[again]
    )
    assert again.result["first_nan_epoch"] is None, again.result
    assert np.isfinite(history.history["loss"]).all(), history.history
    assert int(loaded.optimizer.iterations.numpy()) == saved["iterations"] + STEPS_PER_EPOCH
    assert all(not np.array_equal(a, b) for a, b in zip(before, loaded.get_weights(), strict=True))
    assert type(loaded.optimizer) is keras.optimizers.Adam


@pytest.mark.parametrize(
    "make_inner",
    [
        user_optimizer,
        lambda: keras.optimizers.LossScaleOptimizer(
            keras.optimizers.SGD(learning_rate=0.05, momentum=0.5), initial_scale=64.0
        ),
    ],
    ids=["adam", "loss_scale_sgd"],
)
def test_get_config_nests_the_inner_optimizer_and_from_config_gives_it_back(make_inner):
    keras.utils.set_random_seed(0)
    inner = make_inner()

    def guard(grads, variables, update):
        raise AssertionError("a loaded optimizer must not run the guard")

    wrapped = GuardedOptimizer(inner, guard)
    config = wrapped.get_config()
    assert config["inner_optimizer"] == keras.saving.serialize_keras_object(inner), config
    json.dumps(config)  # a .keras file's config is JSON

    for rebuilt in (
        GuardedOptimizer.from_config(json.loads(json.dumps(config))),
        keras.saving.deserialize_keras_object(
            json.loads(json.dumps(keras.saving.serialize_keras_object(wrapped)))
        ),
    ):
        assert type(rebuilt) is type(inner), type(rebuilt)
        assert rebuilt.get_config() == inner.get_config()
        assert rebuilt is not inner

    # The rebuilt optimizer trains (unguarded: the guard above would raise).
    weight = keras.Variable(np.ones(3, "float32"))
    rebuilt.apply([keras.ops.ones(3)], [weight])
    assert int(rebuilt.iterations.numpy()) == 1
    assert not np.array_equal(weight.numpy(), np.ones(3, "float32"))
