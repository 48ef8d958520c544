"""``NanSentinel`` under ``MultiWorkerMirroredStrategy``: 2 worker processes on 127.0.0.1
(``tests/multiworker.py``), a healthy fit and one whose failure is in one worker's replica.

The functions without ``test_`` are the targets each worker runs. The model is written as
``tests/multiworker.py`` says Keras 3.15 needs under 2 workers (keras-team/keras#20585): made
outside the strategy's scope, built, compiled and fit inside it, its logs given an axis.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from multiworker import ReducibleLogs, isolation_problem, run_workers

_PROBLEM = isolation_problem()
pytestmark = [
    pytest.mark.skipif(_PROBLEM is not None, reason=f"no network namespace: {_PROBLEM}"),
    pytest.mark.xdist_group("multiworker"),
]

EXAMPLES, GLOBAL_BATCH, FEATURES = 64, 16, 4
#: The global batch whose second half (worker 1's shard under the DATA policy) overflows.
BAD_BATCH = 2


def _data(plant: str) -> Any:
    """64 examples in 4 global batches of 16; under the DATA policy worker 1 trains the second
    half of each. ``plant`` puts its fault in worker 1's half of batch ``BAD_BATCH``:
    ``forward``, inputs of 100 (exp(50 x) overflows); ``gradient``, inputs of 0 (the square
    root's gradient at 0 is inf); ``optimizer`` and ``none`` leave the data alone."""
    import tensorflow as tf

    rng = np.random.default_rng(0)
    x = rng.normal(scale=0.01, size=(EXAMPLES, FEATURES)).astype("float32")
    start = BAD_BATCH * GLOBAL_BATCH + GLOBAL_BATCH // 2
    if plant in ("forward", "gradient"):
        x[start : start + GLOBAL_BATCH // 2] = 100.0 if plant == "forward" else 0.0
    y = x.sum(axis=1, keepdims=True)
    data = tf.data.Dataset.from_tensor_slices((x, y)).batch(GLOBAL_BATCH, drop_remainder=True)
    options = tf.data.Options()
    options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.DATA
    return data.with_options(options)


def sentinel_fit(strategy: Any, plant: str) -> dict[str, Any]:
    """A worker: fit a small model with ``plant``'s fault (see ``_data``) under
    ``NanSentinel``: Dense -> exp(50 x) -> Dense for ``forward`` and ``none``; Dense ->
    |h| -> Dense for ``gradient`` (an input of 0 makes h 0);
    for ``optimizer``, Adam with
    ``epsilon=0`` and an input column that is always 0, so its kernel row's gradient and
    second moment are 0 and its first update is 0/0."""
    import keras
    import tensorflow as tf

    from stability import NanSentinel

    class PlantedExp(keras.layers.Layer):
        def call(self, h):
            return tf.exp(50.0 * h)

    class PlantedSqrt(keras.layers.Layer):
        def call(self, h):
            # The norm of h, as a distance: the square root's gradient is inf where h is 0.
            # (sqrt(square(h)) alone is folded into abs(h) by TensorFlow's graph optimizer.)
            return tf.sqrt(tf.reduce_sum(tf.square(h), axis=-1, keepdims=True))

    class Model(ReducibleLogs, keras.Sequential):
        pass

    init = keras.initializers.GlorotUniform
    middle = PlantedSqrt(name="planted_sqrt") if plant == "gradient" else None
    layers = [
        # No bias: an input of 0 makes h exactly 0 (a bias moves off 0 with the first update).
        keras.layers.Dense(4, kernel_initializer=init(1), use_bias=False, name="dense_in"),
        middle or PlantedExp(name="planted_exp"),
        keras.layers.Dense(1, kernel_initializer=init(2), name="dense_out"),
    ]
    model = Model(layers)
    epsilon = 0.0 if plant == "optimizer" else 1e-7
    data = _data(plant)
    if plant == "optimizer":  # one input column always 0
        data = data.map(lambda x, y: (x * tf.constant([1.0, 1.0, 1.0, 0.0]), y))
    sentinel = NanSentinel(verbose=False)
    with strategy.scope():
        model.build((None, FEATURES))
        model.compile(optimizer=keras.optimizers.Adam(1e-3, epsilon=epsilon), loss="mse")
        model.optimizer.build(model.trainable_variables)
        history = model.fit(data, epochs=2, verbose=0, callbacks=[sentinel])
    weights = [np.asarray(w) for w in model.get_weights()]
    return {
        "result": sentinel.result,
        "loss": [float(v) for v in history.history["loss"]],
        "finite": bool(all(np.isfinite(w).all() for w in weights)),
        "steps": int(model.optimizer.iterations.numpy()),
    }


def sentinel_fits(strategy: Any, plants: list[str]) -> dict[str, dict[str, Any]]:
    """A worker: ``sentinel_fit`` for each of ``plants`` in turn, each a new model and a new
    ``NanSentinel`` under the one strategy (a worker process can make only one: its
    collectives are configured at program startup)."""
    return {plant: sentinel_fit(strategy, plant) for plant in plants}


#: The plants of the default run, fitted by one pair of workers (a pair costs a TensorFlow
#: import in each, most of its time). The healthy fit comes first, so that no failure before
#: it can explain its result.
PLANTS = ("none", "gradient", "optimizer")


def _fit_all(plants: list[str]) -> dict[str, list[dict[str, Any]]]:
    """Per plant, each worker's ``sentinel_fit`` result, worker 0's first: one pair of
    workers fits every plant in turn."""
    results = run_workers(
        "test_sentinel_multiworker:sentinel_fits", {"plants": plants}, timeout=300
    )
    return {plant: [worker[plant] for worker in results] for plant in plants}


@pytest.fixture(scope="module")
def fits() -> dict[str, list[dict[str, Any]]]:
    """The default run's plants (``PLANTS``), fitted once for the module's tests."""
    return _fit_all(list(PLANTS))


def test_a_healthy_multiworker_fit_raises_no_alarm(fits):
    for worker in fits["none"]:
        assert worker["result"]["first_nan_step"] is None, worker
        assert worker["finite"] and all(np.isfinite(worker["loss"]))
        assert worker["steps"] == 2 * EXAMPLES // GLOBAL_BATCH


def _same_failure_on_both(results: list[dict[str, Any]], step: int, stage: str) -> list[dict]:
    """Both workers stop at ``step`` (their collectives must) and name the same stage and
    replica; the failing update was held back on both."""
    found = [worker["result"] for worker in results]
    for result in found:
        assert (result["first_nan_epoch"], result["first_nan_step"]) == (1, step), result
        assert result["first_nan_where"] == stage, result
        assert result["replica"] == found[0]["replica"]
    return found


@pytest.mark.parametrize(
    ("plant", "stage", "layer", "op", "cause"),
    [
        # The forward plant runs with the slow tests: the gradient plant crosses the same
        # collective path and, a gradient op's failure being named from its forward op,
        # the forward replay too (tests/test_sentinel_setups.py names a forward plant
        # under MirroredStrategy in the default run).
        pytest.param(
            "forward", "forward", "planted_exp", "Exp ", "forward overflow", marks=pytest.mark.slow
        ),
        ("gradient", "gradient", "planted_sqrt", "Sqrt ", "non-finite gradient op"),
    ],
)
def test_a_failure_in_one_workers_replica_is_reported_once_with_its_replica(
    fits, plant, stage, layer, op, cause
):
    # A slow plant is not in the shared pair: it gets a pair of its own.
    results = fits[plant] if plant in fits else _fit_all([plant])[plant]
    found = _same_failure_on_both(results, BAD_BATCH + 1, stage)
    assert found[0]["replica"] == 1, "the fault is in worker 1's half of the batch"
    assert all(worker["finite"] for worker in results), "the failing update is held back"
    # The failing replica's worker replays its batch and names the layer and op.
    assert found[1]["first_nan_layer"] == layer
    assert found[1]["first_nan_op"].startswith(op), found[1]
    assert found[1]["failure_cause"] == cause
    # The other worker has no batch of that replica: it says so instead of guessing.
    assert found[0]["first_nan_layer"] is None
    assert found[0]["first_nan_op"].startswith("not named")


def test_an_update_failure_is_named_by_the_weight_it_left_non_finite(fits):
    """Adam's 0/0 writes NaN into every replica's copy of the weight (the update is applied
    everywhere after the all-reduce), so every replica's after-update check fails: the first
    replica is reported, on both workers, with the weight's layer."""
    found = _same_failure_on_both(fits["optimizer"], 1, "weights")
    for result in found:
        assert result["replica"] == 0
        assert result["first_nan_layer"].endswith("dense_in"), result
        assert result["first_nan_op"].startswith("Adam update"), result
        assert result["failure_cause"] == "optimizer"
