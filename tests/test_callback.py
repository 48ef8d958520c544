"""NanSentinel on plain Keras models that are not GNNs."""

import keras
import numpy as np
import pytest
import tensorflow as tf

from stability import NanSentinel


@keras.saving.register_keras_serializable(package="stability_tests")
class PlantedExp(keras.layers.Layer):
    """exp(50 x): overflows float32 once x > 1.77."""

    def call(self, x):
        return tf.exp(50.0 * x)


@keras.saving.register_keras_serializable(package="stability_tests")
class PlantedSqrt(keras.layers.Layer):
    """sqrt(x): NaN for every negative input."""

    def call(self, x):
        return tf.sqrt(x)


def model_with(planted: keras.layers.Layer) -> keras.Model:
    inputs = keras.Input((4,))
    hidden = keras.layers.Dense(8, name="first")(inputs)
    hidden = planted(hidden)
    # Inside tf.function the fused MatMul+BiasAdd+Relu kernel maps NaN inputs to 0.
    hidden = keras.layers.Dense(8, activation="relu", name="relu")(hidden)
    outputs = keras.layers.Dense(1, name="out")(hidden)
    model = keras.Model(inputs, outputs)
    model.compile(keras.optimizers.Adam(1e-3), "mse")
    return model


@pytest.fixture
def data():
    keras.utils.set_random_seed(0)
    x = np.random.default_rng(0).normal(scale=2.0, size=(256, 4)).astype("float32")
    return x, x.sum(axis=1, keepdims=True)


def all_weights_finite(model):
    return all(np.isfinite(w).all() for w in model.get_weights())


def test_planted_overflow_is_named(data):
    model = model_with(PlantedExp(name="planted_exp"))
    sentinel = NanSentinel()
    history = model.fit(*data, epochs=3, batch_size=32, verbose=0, callbacks=[sentinel])
    assert sentinel.result["first_nan_step"] == 1
    assert sentinel.result["first_nan_where"] == "forward"
    assert sentinel.result["first_nan_layer"] == "planted_exp"
    assert sentinel.result["first_nan_op"].startswith("Exp ")
    assert len(history.history["loss"]) == 1, "training must stop at the first NaN"
    assert all_weights_finite(model), "the failing update must not have been applied"


def test_terminate_on_nan_misses_weights_going_nan_behind_a_finite_loss(data):
    model = model_with(PlantedSqrt(name="planted_sqrt"))
    history = model.fit(
        *data, epochs=3, batch_size=32, verbose=0, callbacks=[keras.callbacks.TerminateOnNaN()]
    )
    assert len(history.history["loss"]) == 3, "TerminateOnNaN stopped: the case is not silent"
    assert np.isfinite(history.history["loss"]).all()
    assert not all_weights_finite(model), "the weights were expected to go NaN"


def test_sentinel_catches_weights_going_nan_behind_a_finite_loss(data):
    model = model_with(PlantedSqrt(name="planted_sqrt"))
    sentinel = NanSentinel()
    model.fit(*data, epochs=3, batch_size=32, verbose=0, callbacks=[sentinel])
    result = sentinel.result
    assert (result["first_nan_epoch"], result["first_nan_step"]) == (1, 1)
    assert (result["first_nan_where"], result["first_nan_layer"]) == ("forward", "planted_sqrt")
    assert result["loss_nan_epoch"] is None, "the loss stayed finite"
    assert all_weights_finite(model)


def test_healthy_training_is_left_alone(data):
    model = model_with(keras.layers.Activation("tanh", name="tanh"))
    sentinel = NanSentinel()
    history = model.fit(*data, epochs=2, batch_size=32, verbose=0, callbacks=[sentinel])
    assert len(history.history["loss"]) == 2
    assert sentinel.result["first_nan_epoch"] is None
