"""Keras ``fit`` under ``MultiWorkerMirroredStrategy``: 2 worker processes on 127.0.0.1.

The functions without ``test_`` are the targets the workers run: ``tests/multiworker.py``
imports this module in each worker after the worker's strategy exists. A pair of workers
costs about 12 s on 2 cores, 7 to 8 of them the two TensorFlow imports side by side.
"""

from __future__ import annotations

import hashlib
import math
import os
import time
from typing import Any

import numpy as np
import pytest
from multiworker import ReducibleLogs, WorkerError, isolation_problem, run_workers

_PROBLEM = isolation_problem()
pytestmark = [
    pytest.mark.skipif(_PROBLEM is not None, reason=f"no network namespace: {_PROBLEM}"),
    # One xdist worker runs the file: each pair of processes already takes both cores.
    pytest.mark.xdist_group("multiworker"),
]

#: 64 examples in 4 global batches of 16; the DATA auto-shard policy gives each worker its
#: half of every global batch, so each trains 4 local batches of 8 per epoch.
EXAMPLES = 64
GLOBAL_BATCH = 16
FEATURES = 4
EPOCHS = 2


def _data(distributed: bool) -> Any:
    import tensorflow as tf

    # Every worker draws the same examples and keeps its own part of each batch.
    rng = np.random.default_rng(0)
    x = rng.normal(size=(EXAMPLES, FEATURES)).astype("float32")  # [examples, features]
    y = x @ np.arange(1, FEATURES + 1, dtype="float32")[:, None] + 0.5  # [examples, 1]
    data = tf.data.Dataset.from_tensor_slices((x, y)).batch(GLOBAL_BATCH, drop_remainder=True)
    if distributed:
        options = tf.data.Options()
        policy = tf.data.experimental.AutoShardPolicy.DATA
        options.experimental_distribute.auto_shard_policy = policy
        data = data.with_options(options)
    return data


def _model(base: type) -> Any:
    """A Dense regression of ``base`` (a Sequential class), unbuilt: its variables are made
    where it is built. Seeded initializers give every process the same first weights."""
    import keras

    return base(
        [
            keras.layers.Dense(8, "relu", kernel_initializer=keras.initializers.GlorotUniform(1)),
            keras.layers.Dense(1, kernel_initializer=keras.initializers.GlorotUniform(2)),
        ]
    )


def _fit(model: Any, data: Any) -> dict[str, Any]:
    """Build, compile and fit ``model`` in the current strategy's scope; its losses and
    weights."""
    import keras

    model.build((None, FEATURES))
    model.compile(optimizer=keras.optimizers.Adam(0.01), loss="mse")
    model.optimizer.build(model.trainable_variables)
    history = model.fit(data, epochs=EPOCHS, verbose=0, shuffle=False)
    evaluated = model.evaluate(data, verbose=0, return_dict=True)
    weights = [np.asarray(w, dtype="float64") for w in model.get_weights()]
    return {
        "loss": [float(v) for v in history.history["loss"]],
        "eval_loss": float(evaluated["loss"]),
        "steps": int(model.optimizer.iterations.numpy()),
        "weights": [w.ravel().tolist() for w in weights],
        "digest": hashlib.sha256(b"".join(w.tobytes() for w in weights)).hexdigest(),
    }


def fit_dense(strategy: Any) -> dict[str, Any]:
    """One worker's fit; with its task index, replica count and network interfaces."""
    import keras

    class Model(ReducibleLogs, keras.Sequential):
        pass

    # Created outside the scope, built and trained inside it (tests/multiworker.py says why).
    model = _model(Model)
    with strategy.scope():
        result = _fit(model, _data(distributed=True))
    with open("/proc/net/dev") as table:
        interfaces = [line.split(":")[0].strip() for line in table.readlines()[2:]]
    return {
        **result,
        "task": strategy.cluster_resolver.task_id,
        "replicas": strategy.num_replicas_in_sync,
        "interfaces": interfaces,
    }


def fail_in_worker_1(strategy: Any) -> dict[str, Any]:
    """Worker 1 raises; worker 0 builds its model in the scope, where the first collective
    (the variables' initial values) waits for worker 1 for ever."""
    if strategy.cluster_resolver.task_id == 1:
        raise ValueError("worker 1 broke on purpose")
    return fit_dense(strategy)


def sleep(strategy: Any, seconds: float) -> dict[str, Any]:
    time.sleep(seconds)
    return {"pid": os.getpid()}


@pytest.fixture(scope="module")
def workers() -> list[dict[str, Any]]:
    started = time.monotonic()
    results = run_workers("test_multiworker:fit_dense", timeout=120)
    print(f"a pair of workers fitting: {time.monotonic() - started:.1f} s")
    return results


def test_both_workers_end_with_the_same_weights(workers):
    assert [r["task"] for r in workers] == [0, 1]
    assert all(r["replicas"] == 2 for r in workers), [r["replicas"] for r in workers]
    for result in workers:
        assert all(map(math.isfinite, result["loss"])), f"non-finite loss: {result['loss']}"
        assert result["steps"] == EPOCHS * EXAMPLES // GLOBAL_BATCH, result["steps"]
    assert workers[0]["digest"] == workers[1]["digest"], "the workers' weights differ"
    assert workers[0]["loss"] == workers[1]["loss"], [r["loss"] for r in workers]


def test_the_workers_train_as_one_process_on_the_global_batch(workers):
    import keras

    # The same model, data and batches in this process: the workers' halves of each global
    # batch, their gradients summed, are that batch's step (up to the sums' rounding).
    alone = _fit(_model(keras.Sequential), _data(distributed=False))
    for mine, theirs in zip(alone["weights"], workers[0]["weights"], strict=True):
        np.testing.assert_allclose(theirs, mine, rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(workers[0]["loss"], alone["loss"], rtol=1e-4)
    np.testing.assert_allclose(workers[0]["eval_loss"], alone["eval_loss"], rtol=1e-4)


def test_the_workers_see_only_loopback(workers):
    assert all(r["interfaces"] == ["lo"] for r in workers), [r["interfaces"] for r in workers]


def test_a_failing_worker_is_named_and_nothing_hangs():
    started = time.monotonic()
    with pytest.raises(WorkerError, match="worker 1 failed: ValueError: worker 1 broke") as error:
        run_workers("test_multiworker:fail_in_worker_1", timeout=120)
    seconds = time.monotonic() - started
    assert error.value.failed == [1] and not error.value.timed_out, str(error.value)
    assert "worker 0 was killed" in str(error.value), str(error.value)
    assert seconds < 60, f"the failing pair took {seconds:.0f} s"


def test_a_pair_past_its_timeout_is_killed():
    started = time.monotonic()
    with pytest.raises(WorkerError, match="ran past their timeout") as error:
        run_workers("test_multiworker:sleep", {"seconds": 600}, timeout=3)
    assert error.value.timed_out and error.value.failed == [], str(error.value)
    assert time.monotonic() - started < 30
