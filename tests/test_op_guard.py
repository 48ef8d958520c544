"""The op guards (``stability.model.op_guard``): each keeps its op finite, value and gradient,
where the raw op is not, changes nothing inside the op's domain, and rewrites only the ops
of the layer it guards, recording the user's line that built each."""

import keras
import numpy as np
import pytest
import tensorflow as tf

from stability.doctor.run import failing_ops
from stability.model.op_guard import GUARDS, guard_layer, guard_named, sites

#: guard -> (the op as a user writes it, an input outside its domain, inputs inside it)
CASES = {
    "guard_sqrt": (lambda x: tf.sqrt(x), [0.0, -1e-9], [1e-3, 2.0, 1e4]),
    "guard_rsqrt": (lambda x: tf.math.rsqrt(x), [0.0, -1.0], [1e-3, 2.0, 1e4]),
    "guard_log": (lambda x: tf.math.log(x), [0.0, -1.0], [1e-30, 2.0, 1e30]),
    "guard_log_zero": (lambda x: tf.math.log(x), [0.0, -1.0], [1e-30, 2.0, 1e30]),
    "guard_acos": (lambda x: tf.acos(x), [1.0, -1.0000001], [-0.5, 0.0, 0.9]),
    "guard_asin": (lambda x: tf.asin(x), [1.0, 1.0000001], [-0.5, 0.0, 0.9]),
    "guard_exp_cap": (lambda x: tf.exp(x), [100.0, 89.0], [-50.0, 0.0, 40.0]),
    "guard_divide": (lambda x: x / (x - x), [0.0, 3.0], []),
    # A scale that came out tiny: 1 / 1e-30 is finite, its square is not.
    "guard_divide_floor": (lambda x: tf.square(1.0 / x), [1e-30, -1e-30], [0.5, -4.0, 1e3]),
    # A -inf mask where x is 0, times x: -inf * 0 (keras-gat's -10e9 * (1 - A) in float16).
    "guard_multiply": (
        lambda x: tf.where(tf.equal(x, 0), tf.fill(tf.shape(x), -np.inf), tf.ones_like(x)) * x,
        [0.0, 2.0],
        [0.5, 2.0, -3.0],
    ),
    "guard_reciprocal": (lambda x: tf.math.reciprocal(x), [0.0, -0.0], [0.5, -4.0]),
    "guard_pow": (lambda x: tf.pow(x, -0.5), [0.0, -2.0], [0.25, 4.0, 1e6]),
    # Two segments, the elements above 1 in the second: with none there it is empty, its
    # max the lowest float, and twice that overflows.
    "guard_segment_max": (
        lambda x: 2.0 * tf.math.unsorted_segment_max(x, tf.cast(x > 1.0, tf.int32), 2),
        [0.0, 0.5],
        [0.25, 4.0, 1e6],
    ),
}


class Op(keras.layers.Layer):
    def __init__(self, fn, **kwargs):
        super().__init__(**kwargs)
        self.fn = fn

    def call(self, x):
        return self.fn(x)


def _value_and_gradient(layer, x):
    """The layer's output on ``x`` in a traced step, and the gradient of its sum with
    respect to a weight ``w`` (all ones) that scales ``x``, as a training step takes it."""
    x = tf.constant(x, tf.float32)
    w = tf.Variable(tf.ones_like(x))

    @tf.function
    def run(x):
        with tf.GradientTape() as tape:
            y = layer(w * x)
            total = tf.reduce_sum(y)
        return y, tape.gradient(total, w)

    y, g = run(x)
    return y.numpy(), g.numpy()


@pytest.mark.parametrize("name", sorted(CASES))
def test_a_guard_keeps_value_and_gradient_finite_outside_the_domain(name):
    fn, outside, _ = CASES[name]
    raw = Op(fn)
    y, g = _value_and_gradient(raw, outside)
    assert not (np.isfinite(y).all() and np.isfinite(g).all()), "guards the test: raw op fails"
    guarded = Op(fn)
    guard_layer(guarded, guard_named(name))
    y, g = _value_and_gradient(guarded, outside)
    assert np.isfinite(y).all() and np.isfinite(g).all(), (name, y, g)


def test_the_log_of_an_empty_sum_is_0_not_an_outlier():
    """guard_log_zero gives an empty segment 0, as scatter libraries do (the value
    pytorch_scatter#369 chose); guard_log gives it log(tiny), -87.3 in float32."""
    values = {}
    for name in ("guard_log", "guard_log_zero"):
        guarded = Op(lambda x: tf.math.log(x))
        guard_layer(guarded, guard_named(name))
        values[name], gradient = _value_and_gradient(guarded, [0.0, 1.0])
        assert np.isfinite(gradient).all()
    np.testing.assert_allclose(values["guard_log_zero"], [0.0, 0.0])
    assert values["guard_log"][0] < -80


def _log_sum_exp(x):
    """A log-sum-exp over two segments written the stable way (the segment's max
    subtracted, then added back); the second segment is empty."""
    ids = tf.zeros_like(x, tf.int32)
    top = tf.math.unsorted_segment_max(x, ids, 2)
    total = tf.math.unsorted_segment_sum(tf.exp(x - tf.gather(top, ids)), ids, 2)
    return tf.math.log(total) + top


def test_an_empty_segments_log_sum_exp_is_0_with_both_guards_and_not_with_one():
    """rusty1s/pytorch_scatter#368: the empty segment's log-sum-exp is log(0) + lowest. The
    log's guard alone leaves the lowest float (which the next layer overflows), the
    segment max's guard alone leaves log(0); both give 0, as pytorch_scatter#369 does."""
    values = {}
    for names in (
        ("guard_log_zero",),
        ("guard_segment_max",),
        ("guard_segment_max", "guard_log_zero"),
    ):
        layer = Op(_log_sum_exp)
        for name in names:
            guard_layer(layer, guard_named(name))
        values[names], gradient = _value_and_gradient(layer, [1.0, 3.0])
        assert np.isfinite(gradient).all(), names
    raw, _ = _value_and_gradient(Op(_log_sum_exp), [1.0, 3.0])
    np.testing.assert_allclose(values[("guard_segment_max", "guard_log_zero")], [raw[0], 0.0])
    assert values[("guard_log_zero",)][1] < -1e38
    assert values[("guard_segment_max",)][1] == -np.inf


def test_the_ops_feeding_an_op_are_those_of_the_layer_nearest_first():
    """``producer_types``: the ops upstream of the layer's RealDiv, inside its call only (not
    the Exp of the layer before it), nearest first; the layer's call is left as it was."""
    from stability.model.op_guard import producer_types

    class Softmax(keras.layers.Layer):
        def call(self, x):
            e = tf.exp(tf.sqrt(tf.abs(x)))
            return e / tf.reduce_sum(e, axis=-1, keepdims=True)

    class Net(keras.Model):
        def __init__(self):
            super().__init__()
            self.before = Op(tf.exp, name="before")
            self.softmax = Softmax(name="softmax")

        def call(self, x):
            return self.softmax(tf.math.log(self.before(x)))

    model, x = Net(), tf.ones((2, 3))
    model(x)
    found = producer_types(model.softmax, model, x, ("RealDiv",))
    assert found.index("Exp") < found.index("Sqrt") < found.index("Abs"), found
    assert "Sum" in found and "Log" not in found, found
    assert producer_types(model.softmax, model, x, ("Log",)) == ()
    assert "call" not in model.softmax.__dict__, "the layer's own call is back"
    assert not sites(model.softmax)


@pytest.mark.parametrize("name", sorted(n for n, case in CASES.items() if case[2]))
def test_a_guard_changes_nothing_inside_the_domain(name):
    fn, _, inside = CASES[name]
    guarded = Op(fn)
    guard_layer(guarded, guard_named(name))
    expected, expected_gradient = _value_and_gradient(Op(fn), inside)
    y, g = _value_and_gradient(guarded, inside)
    np.testing.assert_allclose(y, expected, rtol=1e-6)
    np.testing.assert_allclose(g, expected_gradient, rtol=1e-6)


def test_the_shifted_exp_leaves_a_softmax_as_it_was_and_finite_where_it_overflowed():
    def softmax(x):
        e = tf.exp(x)
        return e / tf.reduce_sum(e)

    guarded = Op(softmax)
    guard_layer(guarded, guard_named("guard_exp_shift"))
    small = [0.5, -1.0, 2.0]
    np.testing.assert_allclose(
        _value_and_gradient(guarded, small)[0], _value_and_gradient(Op(softmax), small)[0], 1e-6
    )
    y, g = _value_and_gradient(guarded, [100.0, 99.0])
    assert np.isfinite(y).all() and np.isfinite(g).all()
    assert not np.isfinite(_value_and_gradient(Op(softmax), [100.0, 99.0])[0]).all()


def test_an_integral_power_is_left_alone():
    guarded = Op(lambda x: tf.pow(x, 2.0))
    guard_layer(guarded, guard_named("guard_pow"))
    y, _ = _value_and_gradient(guarded, [-3.0, 0.0])
    np.testing.assert_allclose(y, [9.0, 0.0])


def test_only_the_guarded_layers_ops_are_rewritten_and_each_names_the_users_line():
    class Two(keras.Model):
        def __init__(self):
            super().__init__()
            self.first, self.second = Op(tf.sqrt, name="first"), Op(tf.sqrt, name="second")

        def call(self, x):
            return self.first(x) + self.second(x)

    model = Two()
    guard_layer(model.first, guard_named("guard_sqrt"))
    _, g = _value_and_gradient(model, [0.0])
    assert np.isnan(g).all() or np.isinf(g).all(), "the second layer's sqrt stays raw"
    found = sites(model.first)
    assert found and {s.op_type for s in found} == {"Sqrt"}
    assert not sites(model.second)
    # The op was built by ``Op.call`` in this file: the line is the user's, not Keras'.
    assert all(s.file == __file__ for s in found), found
    with open(__file__, encoding="utf-8") as source:
        lines = source.read().splitlines()
    assert all("return self.fn(x)" in lines[s.line - 1] for s in found), found


def test_every_guard_has_a_distinct_name_and_op_types():
    assert len({g.name for g in GUARDS}) == len(GUARDS)
    assert all(g.op_types and g.name.startswith("guard_") for g in GUARDS)


@pytest.mark.parametrize(
    ("text", "ops"),
    [
        ("Sqrt (Sqrt) gradient: SqrtGrad", ("Sqrt",)),
        ("ConcatV2 (concat) gradient: SqrtGrad", ("ConcatV2", "Sqrt")),
        ("Exp (Exp_1)", ("Exp",)),
        ("HalfStepAdam update: RealDiv (truediv_1) 0/0 in the update", ("RealDiv",)),
        ("softmax normalization: weights sum to 0 at 3 of 5 nodes", ()),
        ("", ()),
    ],
)
def test_the_failing_ops_are_read_from_a_rows_op_text(text, ops):
    assert failing_ops(text) == ops


# --- the fix as code (``stability.doctor.code_fix``) -----------------------------------------

REWRITES = [
    (
        "guard_sqrt",
        "std = K.sqrt(K.mean(x ** 2) - K.mean(x) ** 2)",
        "std = K.sqrt(K.maximum(K.mean(x ** 2) - K.mean(x) ** 2, 1.19e-07))",
    ),
    (
        "guard_sqrt",
        "d = tf.norm(v, axis=-1)  # the distance",
        "d = tf.sqrt(tf.maximum(tf.reduce_sum(tf.square(v), axis=-1), 1.19e-07))  # the distance",
    ),
    (
        "guard_sqrt",
        "n = keras.ops.sqrt(keras.ops.sum(mu ** 2, axis=-2))",
        "n = keras.ops.sqrt(keras.ops.maximum(keras.ops.sum(mu ** 2, axis=-2), 1.19e-07))",
    ),
    (
        "guard_pow",
        "norm = deg ** -0.5",
        "norm = tf.where(deg > 0, tf.pow(tf.where(deg > 0, deg, 1.0), -0.5), 0.0)",
    ),
    ("guard_divide", "a = e / s", "a = tf.math.divide_no_nan(e, s)"),
    (
        "guard_divide_floor",
        "z = (y - mu) / sigma",
        "z = tf.math.divide(y - mu, tf.where(sigma < 0, tf.minimum(sigma, -1.19e-07), "
        "tf.maximum(sigma, 1.19e-07)))",
    ),
    ("guard_log", "return tf.math.log(p)", "return tf.math.log(tf.maximum(p, 1.18e-38))"),
    (
        "guard_log_zero",
        "h = tf.math.log(s)",
        "h = tf.where(s >= 1.18e-38, tf.math.log(tf.where(s >= 1.18e-38, s, 1.0)), 0.0)",
    ),
    ("guard_exp_cap", "e = tf.exp(a)", "e = tf.exp(tf.minimum(a, 44.36))"),
    (
        "guard_segment_max",
        "top = tf.math.unsorted_segment_max(m, receivers, n)",
        "top = tf.where(tf.math.unsorted_segment_max(m, receivers, n) > -3.40282347e+38, "
        "tf.math.unsorted_segment_max(m, receivers, n), 0.0)",
    ),
    (
        "guard_multiply",
        "mask = -10e9 * (1.0 - A)",
        "mask = tf.math.multiply_no_nan(-10e9, 1.0 - A)",
    ),
]


@pytest.mark.parametrize(("name", "before", "after"), REWRITES)
def test_the_guarded_line_is_written_as_the_user_would_write_it(name, before, after):
    from stability.doctor.code_fix import rewrite_line

    assert rewrite_line(before, guard_named(name), "float32") == after


def test_the_bounds_in_the_code_are_the_dtypes():
    from stability.doctor.code_fix import rewrite_line

    line = rewrite_line("y = tf.sqrt(x)", guard_named("guard_sqrt"), "float64")
    assert line == "y = tf.sqrt(tf.maximum(x, 2.22e-16))"
    assert "0.000977" in rewrite_line("y = tf.sqrt(x)", guard_named("guard_sqrt"), "mixed_float16")


def test_a_line_without_the_op_gets_the_guard_as_a_comment():
    from stability.doctor.code_fix import rewrite_line

    line = rewrite_line("h = self.readout(h)", guard_named("guard_sqrt"), "float32")
    assert line.startswith("h = self.readout(h)  # guard its Sqrt: sqrt(maximum(X, 1.19e-07))")


class Sinc(keras.layers.Layer):
    """sin(x) / d with its limit where d = 0, as DimeNet's basis writes it: the tf.where
    discards the 0 / 0, whose gradient is still NaN."""

    def call(self, d):
        x = d / 5.0
        return tf.sqrt(2 / 5.0) * tf.where(d == 0, tf.ones_like(d), tf.sin(x) / d)


def test_the_fix_is_the_op_the_guard_changed_at_its_columns():
    """Of the layer's two divisions only ``sin(x) / d`` meets d = 0: the fix is that line,
    and on it that division (the frame's columns), not the first ``/`` (Python's 2 / 5.0)."""
    from stability.doctor.code_fix import code_fixes

    layer = Sinc()
    guard_layer(layer, guard_named("guard_divide"))
    layer(tf.constant([[0.0], [1.0], [2.0]]))  # an eager call, as the doctor's check makes
    found = sites(layer)
    assert [s.changed for s in found] == [False, True], found
    [fix] = code_fixes(found, "float32")
    assert (
        fix.before == "return tf.sqrt(2 / 5.0) * tf.where(d == 0, tf.ones_like(d), tf.sin(x) / d)"
    )
    assert fix.after == (
        "return tf.sqrt(2 / 5.0) * tf.where(d == 0, tf.ones_like(d), "
        "tf.math.divide_no_nan(tf.sin(x), d))"
    )


def test_a_product_by_zero_keeps_its_gradient_for_the_other_factor():
    """multiply guards inf * 0 only: x * 0 with x finite still sends x to the zero factor's
    gradient, as the raw product does."""
    x = tf.Variable([3.0, 0.0])
    y = tf.Variable([0.0, 5.0])
    guarded = Op(lambda pair: pair[0] * pair[1])
    guard_layer(guarded, guard_named("guard_multiply"))
    with tf.GradientTape() as tape:
        total = tf.reduce_sum(guarded((x, y)))
    gx, gy = tape.gradient(total, [x, y])
    np.testing.assert_array_equal(gx.numpy(), [0.0, 5.0])
    np.testing.assert_array_equal(gy.numpy(), [3.0, 0.0])


def _nll(y_true, y_pred):
    """A Gaussian NLL whose standard deviation is the second column."""
    mu, sigma = y_pred[:, 0], y_pred[:, 1]
    return tf.reduce_mean(tf.math.log(sigma) + 0.5 * tf.square((y_true - mu) / sigma))


def test_a_guarded_loss_keeps_its_name_records_its_line_and_chains():
    """mllam/neural-lam#537: a softplus sigma of 1e-20 squares a residual of 10 into inf.
    The divisor's floor keeps the loss and its gradient finite; the wrapper is still the
    user's function to Keras and to the harness (its name, ``inspect.unwrap``)."""
    from stability.model.op_guard import guard_loss, loss_sites

    y_true = tf.constant([10.0, 1.0])
    raw_pred = tf.Variable([[0.0, 1e-20], [1.0, 2.0]])
    assert not np.isfinite(_nll(y_true, raw_pred).numpy())
    guarded = guard_loss(_nll, guard_named("guard_divide_floor"))
    assert guarded.__name__ == "_nll" and guarded.__wrapped__ is _nll
    guarded(y_true, raw_pred)  # eagerly, as the doctor's check: the site and its change
    [site] = loss_sites(guarded)
    assert site.op_type == "RealDiv" and site.file == __file__ and site.changed

    @tf.function  # a training step traces the loss: there the guarded value is used
    def step():
        with tf.GradientTape() as tape:
            value = guarded(y_true, raw_pred)
        return value, tape.gradient(value, raw_pred)

    value, gradient = step()
    assert np.isfinite(value.numpy()) and np.isfinite(gradient.numpy()).all()
    chained = guard_loss(guarded, guard_named("guard_log"))
    chained(y_true, tf.constant([[0.0, 0.0], [1.0, 2.0]]))
    assert {s.guard for s in loss_sites(chained)} == {"guard_divide_floor", "guard_log"}
    assert not loss_sites(_nll), "the user's own function is left as it was"


def test_a_keras_loss_is_guarded_in_place_and_stays_a_loss():
    from stability.model.op_guard import guard_loss, loss_sites

    class Nll(keras.losses.Loss):
        def call(self, y_true, y_pred):
            return _nll(y_true, y_pred)

    loss = Nll()
    guarded = guard_loss(loss, guard_named("guard_divide_floor"))
    assert guarded is loss and isinstance(guarded, keras.losses.Loss)
    value = tf.function(guarded)(tf.constant([10.0]), tf.constant([[0.0, 1e-20]]))
    assert np.isfinite(value.numpy()) and loss_sites(loss)


def test_the_divisor_floor_keeps_the_sign_and_leaves_a_scale_above_eps_alone():
    guarded = Op(lambda x: 1.0 / x)
    guard_layer(guarded, guard_named("guard_divide_floor"))
    y, _ = _value_and_gradient(guarded, [1e-30, -1e-30, 0.5, -4.0])
    eps = np.finfo(np.float32).eps
    np.testing.assert_allclose(y, [1 / eps, -1 / eps, 2.0, -0.25], rtol=1e-6)


def test_two_guards_of_one_line_both_rewrite_it(tmp_path):
    """A chain in a loss (neural-lam#537): the division's floor and the log's guard are on
    one line, and the division changed nothing on the doctor's first batch (sigma is tiny
    only after some training): the fix is both, on that line."""
    from stability.doctor.code_fix import code_fixes
    from stability.model.op_guard import Site

    path = tmp_path / "nll.py"
    path.write_text(
        "def nll(y, mu, sigma):\n"
        "    return tf.reduce_mean(tf.math.log(sigma) + tf.square((y - mu) / sigma))\n",
        encoding="utf-8",
    )
    sites = [
        Site("guard_divide_floor", "RealDiv", "truediv", str(path), 2, changed=False),
        Site("guard_log", "Log", "Log", str(path), 2, changed=True),
    ]
    [fix] = code_fixes(sites, "float32")
    assert fix.after == (
        "return tf.reduce_mean(tf.math.log(tf.maximum(sigma, 1.18e-38)) + tf.square("
        "tf.math.divide(y - mu, tf.where(sigma < 0, tf.minimum(sigma, -1.19e-07), "
        "tf.maximum(sigma, 1.19e-07)))))"
    )


def test_a_guard_replaces_the_op_in_a_traced_call_only():
    """docs/doctor.md says so: eagerly TensorFlow runs the raw op (the doctor's eager batch
    only records the site and whether the guard changed it); a traced call uses the guard.
    Fails when TensorFlow starts to use a callback's outputs eagerly too."""
    guarded = Op(tf.sqrt)
    guard_layer(guarded, guard_named("guard_sqrt"))
    x = tf.constant([-1.0, 4.0])
    eager, traced = guarded(x).numpy(), tf.function(guarded)(x).numpy()
    assert np.isnan(eager[0]) and eager[1] == 2.0
    assert np.isfinite(traced).all() and traced[1] == 2.0
    assert [s.changed for s in sites(guarded)] == [True, None]
