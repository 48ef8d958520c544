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


def _data(planted: bool) -> Any:
    import tensorflow as tf

    rng = np.random.default_rng(0)
    x = rng.normal(scale=0.01, size=(EXAMPLES, FEATURES)).astype("float32")
    if planted:
        start = BAD_BATCH * GLOBAL_BATCH + GLOBAL_BATCH // 2
        x[start : start + GLOBAL_BATCH // 2] = 100.0  # exp(50 * 100 * w) overflows
    y = x.sum(axis=1, keepdims=True)
    data = tf.data.Dataset.from_tensor_slices((x, y)).batch(GLOBAL_BATCH, drop_remainder=True)
    options = tf.data.Options()
    options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.DATA
    return data.with_options(options)


def sentinel_fit(strategy: Any, planted: bool) -> dict[str, Any]:
    """A worker: fit a Dense -> exp(50 x) -> Dense model under ``NanSentinel``."""
    import keras
    import tensorflow as tf

    from stability import NanSentinel

    @keras.saving.register_keras_serializable("sentinel_multiworker")
    class PlantedExp(keras.layers.Layer):
        def call(self, h):
            return tf.exp(50.0 * h)

    class Model(ReducibleLogs, keras.Sequential):
        pass

    init = keras.initializers.GlorotUniform
    model = Model(
        [
            keras.layers.Dense(4, kernel_initializer=init(1), name="dense_in"),
            PlantedExp(name="planted_exp"),
            keras.layers.Dense(1, kernel_initializer=init(2), name="dense_out"),
        ]
    )
    sentinel = NanSentinel(verbose=False)
    with strategy.scope():
        model.build((None, FEATURES))
        model.compile(optimizer=keras.optimizers.Adam(1e-3), loss="mse")
        model.optimizer.build(model.trainable_variables)
        history = model.fit(_data(planted), epochs=2, verbose=0, callbacks=[sentinel])
    weights = [np.asarray(w) for w in model.get_weights()]
    return {
        "result": sentinel.result,
        "loss": [float(v) for v in history.history["loss"]],
        "finite": bool(all(np.isfinite(w).all() for w in weights)),
        "steps": int(model.optimizer.iterations.numpy()),
    }


def test_a_healthy_multiworker_fit_raises_no_alarm():
    results = run_workers("test_sentinel_multiworker:sentinel_fit", {"planted": False})
    for worker in results:
        assert worker["result"]["first_nan_step"] is None, worker
        assert worker["finite"] and all(np.isfinite(worker["loss"]))
        assert worker["steps"] == 2 * EXAMPLES // GLOBAL_BATCH


def test_a_failure_in_one_workers_replica_is_reported_once_with_its_replica():
    results = run_workers("test_sentinel_multiworker:sentinel_fit", {"planted": True})
    found = [worker["result"] for worker in results]
    # Both workers stop at the same step (their collectives must), and name the same replica.
    for result in found:
        assert (result["first_nan_epoch"], result["first_nan_step"]) == (1, BAD_BATCH + 1)
        assert result["first_nan_where"] == "forward"
        assert result["replica"] == 1
    assert all(worker["finite"] for worker in results), "the failing update is held back"
    # The failing replica's worker replays its batch and names the layer and op.
    assert found[1]["first_nan_layer"] == "planted_exp"
    assert found[1]["first_nan_op"].startswith("Exp ")
    assert found[1]["failure_cause"] == "forward overflow"
    # The other worker has no batch of that replica: it says so instead of guessing.
    assert found[0]["first_nan_layer"] is None
    assert found[0]["first_nan_op"].startswith("not named")
