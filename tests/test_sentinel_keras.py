"""NanSentinel in every Keras setup: steps_per_execution, XLA, reuse, its stop line and
raise_error, and the attention invariant of a model that exposes its attention."""

import contextlib
import io

import keras
import numpy as np
import pytest
import tensorflow as tf
from test_callback import PlantedExp, all_weights_finite, model_with

from stability import NanSentinel

#: The batch (0-based, unshuffled) whose inputs are planted to overflow exp(50 x).
BAD_BATCH = 7
BATCH = 32


def _late_data():
    keras.utils.set_random_seed(0)
    x = np.random.default_rng(0).normal(scale=0.01, size=(12 * BATCH, 4)).astype("float32")
    x[BAD_BATCH * BATCH : (BAD_BATCH + 1) * BATCH] = 100.0
    return x, x.sum(axis=1, keepdims=True)


@pytest.fixture
def late_data():
    """Healthy inputs except batch ``BAD_BATCH``, whose inputs make exp(50 x) overflow."""
    return _late_data()


def fit(model, data, sentinel, **options):
    x, y = data
    return model.fit(
        x, y, epochs=2, batch_size=BATCH, shuffle=False, verbose=0, callbacks=[sentinel], **options
    )


def planted_model(jit_compile="auto", steps_per_execution=1):
    model = model_with(PlantedExp(name="planted_exp"))
    model.compile(
        keras.optimizers.Adam(1e-3),
        "mse",
        jit_compile=jit_compile,
        steps_per_execution=steps_per_execution,
    )
    return model


@pytest.fixture(scope="module")
def default_fit():
    """One fit of a fresh planted model (default compile) with a default ``NanSentinel``, as
    ``late_data`` seeds it: the model, the sentinel's result, the fit's history, what it
    printed, and whether the weights were finite after it. Three tests read this one fit
    (they each fitted it the same way): the step count at ``steps_per_execution=1``, the
    printed line, and a second sentinel's fit of the model the first one watched."""
    data = _late_data()
    model, sentinel = planted_model(), NanSentinel()
    with contextlib.redirect_stdout(io.StringIO()) as out:
        history = fit(model, data, sentinel)
    return {
        "model": model,
        "data": data,
        "result": dict(sentinel.result),
        "losses": list(history.history["loss"]),
        "printed": out.getvalue(),
        "finite": all_weights_finite(model),
    }


def _counted_in_optimizer_steps(result: dict, losses: list, finite: bool) -> None:
    assert (result["first_nan_epoch"], result["first_nan_step"]) == (1, BAD_BATCH + 1)
    assert (result["first_nan_where"], result["first_nan_layer"]) == ("forward", "planted_exp")
    assert result["first_nan_op"].startswith("Exp ")
    assert len(losses) == 1
    assert finite, "no update after the failing step may be applied"


def test_first_failing_step_is_counted_in_optimizer_steps(default_fit):
    """At ``steps_per_execution=1`` (the default compile: the shared fit)."""
    done = default_fit
    _counted_in_optimizer_steps(done["result"], done["losses"], done["finite"])


def test_first_failing_step_is_counted_in_optimizer_steps_of_a_5_step_execution(late_data):
    model = planted_model(steps_per_execution=5)
    sentinel = NanSentinel()
    history = fit(model, late_data, sentinel)
    finite = all_weights_finite(model)
    _counted_in_optimizer_steps(sentinel.result, history.history["loss"], finite)


@pytest.mark.parametrize("jit_compile", [True, "auto"])
def test_xla_and_auto_do_not_crash_and_find_the_step(late_data, jit_compile):
    model = planted_model(jit_compile=jit_compile, steps_per_execution=3)
    sentinel = NanSentinel()
    fit(model, late_data, sentinel)
    result = sentinel.result
    assert (result["first_nan_epoch"], result["first_nan_step"]) == (1, BAD_BATCH + 1)
    assert result["first_nan_where"] in ("forward", "loss", "gradient")
    assert all_weights_finite(model)


def test_one_sentinel_is_reusable_across_fit_calls_and_models(late_data):
    sentinel = NanSentinel()
    for _ in range(2):
        model = planted_model()
        fit(model, late_data, sentinel)
        assert sentinel.result["first_nan_step"] == BAD_BATCH + 1
        fit(model, late_data, sentinel)  # the same model again: it fails again, afresh
        assert sentinel.result["first_nan_step"] == BAD_BATCH + 1
        assert sentinel.result["first_nan_layer"] == "planted_exp"


def test_a_second_sentinel_on_the_same_model_is_not_blind(default_fit):
    # The first sentinel's fit is the shared one; this is the only test that fits its model
    # again (the others read what the fixture recorded when it fitted).
    model, second = default_fit["model"], NanSentinel()
    assert default_fit["result"]["first_nan_step"] == BAD_BATCH + 1, "the first one saw it"
    fit(model, default_fit["data"], second)
    assert second.result["first_nan_step"] == BAD_BATCH + 1
    assert second.result["first_nan_where"] == "forward"


def test_it_prints_one_line_when_it_stops(default_fit):
    lines = default_fit["printed"].strip().splitlines()
    assert len(lines) == 1, lines
    assert lines[0].startswith(
        f"NanSentinel: epoch 1, step {BAD_BATCH + 1}: nonfinite (forward overflow) at forward"
    )


def test_raise_error_raises_at_the_first_failure(late_data):
    with pytest.raises(
        RuntimeError, match=rf"step {BAD_BATCH + 1}: nonfinite \(forward overflow\) at forward"
    ):
        fit(planted_model(), late_data, NanSentinel(raise_error=True))


class RowAttention(keras.Model):
    """Each row is a node with ``k`` incoming edges; its ``k`` logits start at ``level``.

    Exposes its attention through ``forward`` (docs/plugins.md): the weights ``[rows * k, 1]``
    and their receivers ``[rows * k]``. With level 88.5 every exp is finite (2.7e38) and
    their sum is inf: the weights are 0, and nothing else is non-finite.
    """

    def __init__(self, k=4, level=88.5):
        super().__init__()
        self.k = k
        self.score = keras.layers.Dense(k, name="score", kernel_initializer="zeros")
        self.score.build((None, k))
        self.score.bias.assign(np.full(k, level, np.float32))
        self.out = keras.layers.Dense(1, name="out")
        self.out.build((None, k))

    def forward(self, x):
        logits = self.score(x)  # [rows, k]
        exp = tf.exp(logits)
        alpha = exp / tf.reduce_sum(exp, axis=1, keepdims=True)
        rows = tf.shape(x)[0]
        return {
            "predictions": self.out(alpha * x),
            "alpha": [tf.reshape(alpha, [-1, 1])],
            "logits": [tf.reshape(logits, [-1, 1])],
            "receivers": [tf.repeat(tf.range(rows), self.k)],
            "attention_layers": ["row_attention"],
        }

    def call(self, x):
        return self.forward(x)["predictions"]


@pytest.mark.parametrize("level", [88.5, 0.0])
def test_attention_normalization_is_checked_where_the_model_exposes_it(late_data, level):
    x = late_data[0][: 4 * BATCH] * 0
    model = RowAttention(level=level)
    model.compile(keras.optimizers.Adam(1e-3), "mse")
    sentinel = NanSentinel()
    model.fit(x, x[:, :1], epochs=1, batch_size=BATCH, verbose=0, callbacks=[sentinel])
    result = sentinel.result
    if level == 0.0:  # the control: a healthy softmax raises no flag
        assert result["first_nan_step"] is None
        return
    assert (result["first_nan_epoch"], result["first_nan_step"]) == (1, 1)
    assert (result["first_nan_where"], result["first_nan_layer"]) == ("forward", "row_attention")
    assert result["failure_kind"] == "normalization"
    assert result["first_nan_op"].startswith("softmax normalization: weights sum to 0 ")


def test_a_second_moment_overflow_is_named_at_its_step():
    """An L1 loss on inputs of 1e20: every gradient is about 1e20, so Adam's g * g (1e40)
    overflows float32 at step 1 while every weight stays finite (m / sqrt(inf) = 0). The
    optimizer's state is checked with the weights, so the step that wrote the inf is the one
    named, before the weights go NaN a step later."""
    keras.utils.set_random_seed(0)
    x = np.full((64, 4), 1e20, np.float32)
    y = np.zeros((64, 1), np.float32)
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1, name="dense")])
    model.compile(keras.optimizers.Adam(1e-3), "mae")
    sentinel = NanSentinel(verbose=False)
    model.fit(x, y, epochs=1, batch_size=32, shuffle=False, verbose=0, callbacks=[sentinel])
    result = sentinel.result
    assert (result["first_nan_epoch"], result["first_nan_step"]) == (1, 1), result
    assert result["first_nan_where"] == "weights"
    assert result["failure_cause"] == "gradient explosion", result
    assert "not finite" in result["first_nan_op"] and "velocity" in result["first_nan_op"]
    assert sentinel.report is not None and sentinel.report.stat("max_abs_grad") >= 1e19
