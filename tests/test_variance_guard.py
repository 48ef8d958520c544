"""``guard_variance_centered``: a variance written ``E[x^2] - E[x]^2`` recomputed from the
deviations, however the user spelt its squares and means; every other subtraction is left
as it was."""

import numpy as np
import pytest
import tensorflow as tf
from keras import ops
from test_op_guard import Op

from stability.doctor.code_fix import code_fixes, rewrite_line
from stability.model.op_guard import guard_layer, guard_named, sites

GUARD = guard_named("guard_variance_centered")


#: A layer whose call is the function it is given (the variance as a user writes it).
Variance = Op


SPELLINGS = {
    # Keras 3.0's ops.moments (keras-team/keras#18795), the mean a constant to the tape.
    "keras ops": lambda x: (
        ops.mean(ops.square(x), 0) - ops.square(ops.stop_gradient(ops.mean(x, 0)))
    ),
    "tf, keepdims": lambda x: (
        tf.reduce_mean(tf.square(x), axis=0, keepdims=True)
        - tf.square(tf.reduce_mean(x, axis=0, keepdims=True))
    ),
    "powers": lambda x: tf.reduce_mean(x**2, axis=[0]) - tf.reduce_mean(x, axis=[0]) ** 2,
    "products": lambda x: tf.reduce_mean(x * x, 0) - tf.reduce_mean(x, 0) * tf.reduce_mean(x, 0),
}


def _features() -> np.ndarray:
    """``[64, 3]`` features: heights of about 1000 within 2 (the zoo's slab), a unit
    normal, and a constant: float32 keeps none of the first's variance as E[x^2] - E[x]^2."""
    rng = np.random.default_rng(0)
    return np.stack(
        [1000.0 + rng.uniform(0.0, 2.0, 64), rng.normal(size=64), np.full(64, 3.0)], axis=1
    ).astype(np.float32)


def _traced(layer, x):
    x = tf.constant(x)

    @tf.function
    def run(x):
        with tf.GradientTape() as tape:
            tape.watch(x)
            v = layer(x)
            total = tf.reduce_sum(v * tf.constant([1.0, 2.0, 3.0]))
        return v, tape.gradient(total, x)

    v, g = run(x)
    return np.reshape(v.numpy(), [-1]), g.numpy()


@pytest.mark.parametrize("spelling", sorted(SPELLINGS))
def test_the_guarded_variance_is_the_float64_one_where_the_raw_cancels(spelling):
    x = _features()
    truth = np.var(x.astype(np.float64), axis=0)
    raw, _ = _traced(Variance(SPELLINGS[spelling]), x)
    guarded_layer = Variance(SPELLINGS[spelling])
    guard_layer(guarded_layer, GUARD)
    guarded, gradient = _traced(guarded_layer, x)
    assert abs(raw[0] - truth[0]) > 0.1 * truth[0], "the raw variance must cancel here"
    np.testing.assert_allclose(guarded, truth, rtol=1e-4, atol=1e-6)
    # The gradient of the true variance: 2 (x - mean) / n per column, times its weight.
    expected = 2.0 * (x - x.mean(axis=0)) / len(x) * np.array([1.0, 2.0, 3.0])
    np.testing.assert_allclose(gradient, expected, rtol=1e-3, atol=1e-6)
    assert [s.op_type for s in sites(guarded_layer)] == ["Sub"]


@pytest.mark.parametrize(
    "fn",
    [
        lambda x: x - 1.0,
        # The means of two different tensors, and over two different axes.
        lambda x: tf.reduce_mean(tf.square(x), 0) - tf.square(tf.reduce_mean(2.0 * x, 0)),
        lambda x: tf.reduce_mean(tf.square(x)) - tf.square(tf.reduce_mean(x, 0)),
        # Over segments: another grouping of the rows on each side.
        lambda x: (
            tf.math.unsorted_segment_mean(tf.square(x), IDS, 4)
            - tf.square(tf.math.unsorted_segment_mean(x, IDS[::-1], 4))
        ),
        # Over segments, divided by other counts: not the mean the left side takes.
        lambda x: (
            tf.math.unsorted_segment_sum(tf.square(x), IDS, 4) / _count(IDS)
            - tf.square(tf.math.unsorted_segment_sum(x, IDS, 4) / (_count(IDS) + 1.0))
        ),
    ],
)
def test_a_subtraction_that_is_no_variance_is_left_alone(fn):
    x = _features()
    layer = Variance(fn)
    guard_layer(layer, GUARD)
    np.testing.assert_array_equal(_traced(layer, x)[0], _traced(Variance(fn), x)[0])
    assert not sites(layer)


def test_an_eager_call_records_the_site_and_that_the_guard_changed_it():
    """The doctor decides that a guard applies from an eager batch, where the ops that
    made the subtraction's inputs are known only from the callback's own record."""
    layer = Variance(SPELLINGS["keras ops"])
    guard_layer(layer, GUARD)
    layer(tf.constant(_features()))
    [site] = sites(layer)
    assert site.changed is True and site.file == __file__


@pytest.mark.parametrize(
    ("before", "after"),
    [
        (
            "var = ops.mean(ops.square(x), axes) - ops.square(ops.stop_gradient(mean))",
            "var = ops.mean(ops.square(x - ops.mean(x, axes, keepdims=True)), axes)",
        ),
        (
            "v = tf.reduce_mean(h ** 2, axis=0, keepdims=True) - tf.reduce_mean(h, axis=0) ** 2",
            "v = tf.reduce_mean(tf.square(h - tf.reduce_mean(h, axis=0, keepdims=True)), "
            "axis=0, keepdims=True)",
        ),
        # A graph norm's variance: each row less its own segment's mean, gathered back.
        (
            "var = tf.math.unsorted_segment_mean(tf.square(h), graph, n) "
            "- tf.square(tf.math.unsorted_segment_mean(h, graph, n))",
            "var = tf.math.unsorted_segment_mean(tf.square(h - tf.gather("
            "tf.math.unsorted_segment_mean(h, graph, n), graph)), graph, n)",
        ),
        (
            "var = ops.segment_sum(h ** 2, ids, n) / count "
            "- (ops.segment_sum(h, ids, n) / count) ** 2",
            "var = ops.segment_sum(ops.square(h - ops.take(ops.segment_sum(h, ids, n) / count, "
            "ids, axis=0)), ids, n) / count",
        ),
        (
            "v = ops.mean(h * h, 0) - ops.square(m)",
            "v = ops.mean(ops.square(h - ops.mean(h, 0, keepdims=True)), 0)",
        ),
        # A left term that squares nothing it can name: the guard's expression, said so.
        (
            "v = tf.reduce_mean(tf.abs(h), 0) - tf.square(m)",
            "v = mean(square(x - mean(x)))  # in place of tf.subtract(tf.reduce_mean("
            "tf.abs(h), 0), tf.square(m))",
        ),
    ],
)
def test_the_fix_is_written_in_the_users_own_calls(before, after):
    assert rewrite_line(before, GUARD, "float32") == after


def _pasted_back(source, text, call):
    """The fix the doctor prints for the variance in ``text`` (a module written to
    ``source``; ``call(namespace, x)`` calls it), the guarded values, and the values of
    the module with the fix pasted in."""
    source.write_text(text)
    namespace: dict = {}
    exec(compile(text, str(source), "exec"), namespace)
    layer = Variance(lambda x: call(namespace, x))
    guard_layer(layer, GUARD)
    guarded, _ = _traced(layer, _features())
    [fix] = code_fixes(sites(layer), "float32")
    fixed = text.replace(fix.before, fix.after)
    assert fixed != text
    exec(compile(fixed, str(source), "exec"), namespace)
    pasted, _ = _traced(Variance(lambda x: call(namespace, x)), _features())
    return fix, guarded, pasted


def test_the_printed_fix_runs_and_gives_the_guarded_variance(tmp_path):
    """The line the doctor prints, pasted into the user's function, computes what the
    guard computed."""
    text = (
        "from keras import ops\n\n\ndef variance(x, axes):\n"
        "    mean = ops.stop_gradient(ops.mean(x, axes))\n"
        "    return ops.mean(ops.square(x), axes) - ops.square(mean)\n"
    )
    _, guarded, pasted = _pasted_back(
        tmp_path / "moments.py", text, lambda n, x: n["variance"](x, 0)
    )
    np.testing.assert_allclose(pasted, guarded, rtol=1e-6)


def test_a_variance_written_over_several_lines_is_rewritten_whole(tmp_path):
    """The expression spans two lines (as tests/data/check_planted.py writes it): the fix
    names both and rewrites the expression, not one line of it as a comment."""
    source = tmp_path / "spread.py"
    source.write_text(
        "import tensorflow as tf\n\n\ndef variance(x):\n"
        "    var = (\n"
        "        tf.reduce_mean(x**2, axis=0)\n"
        "        - tf.reduce_mean(x, axis=0) ** 2\n"
        "    )\n"
        "    return var\n"
    )
    namespace: dict = {}
    exec(compile(source.read_text(), str(source), "exec"), namespace)
    layer = Variance(namespace["variance"])
    guard_layer(layer, GUARD)
    _traced(layer, _features())
    [fix] = code_fixes(sites(layer), "float32")
    assert fix.where.endswith("spread.py:6-7")
    assert fix.before == "tf.reduce_mean(x**2, axis=0) - tf.reduce_mean(x, axis=0) ** 2"
    assert fix.after == (
        "tf.reduce_mean(tf.square(x - tf.reduce_mean(x, axis=0, keepdims=True)), axis=0)"
    )


#: ``[64]`` ids: four segments of 16 rows (graphs of a batch), in order.
IDS = np.repeat(np.arange(4), 16).astype(np.int32)


def _count(ids):
    """Each segment's rows, ``[4, 1]``: a graph's size, as a graph norm counts it."""
    return tf.math.unsorted_segment_sum(tf.ones_like(ids, tf.float32), ids, 4)[:, None]


SEGMENT_SPELLINGS = {
    "unsorted_segment_mean": lambda x: (
        tf.math.unsorted_segment_mean(tf.square(x), IDS, 4)
        - tf.square(tf.math.unsorted_segment_mean(x, IDS, 4))
    ),
    "keras ops, sum over count": lambda x: (
        lambda ids, count: (
            ops.segment_sum(ops.square(x), ids, 4) / count
            - ops.square(ops.segment_sum(x, ids, 4) / count)
        )
    )(tf.constant(IDS), _count(tf.constant(IDS))),
    "segment_mean, powers": lambda x: (
        tf.math.segment_mean(x**2, IDS) - tf.math.segment_mean(x, IDS) ** 2
    ),
}


@pytest.mark.parametrize("spelling", sorted(SEGMENT_SPELLINGS))
def test_a_segment_variance_is_the_float64_one_where_the_raw_cancels(spelling):
    """A graph norm's per-graph variance, segment_mean(x^2) - segment_mean(x)^2: each
    graph's deviations from its own mean, squared and averaged over the graph."""
    x = _features()
    rows = x.astype(np.float64).reshape(4, 16, 3)
    truth = rows.var(axis=1)
    raw, _ = _traced(Variance(SEGMENT_SPELLINGS[spelling]), x)
    layer = Variance(SEGMENT_SPELLINGS[spelling])
    guard_layer(layer, GUARD)
    guarded, gradient = _traced(layer, x)
    assert np.max(np.abs(raw.reshape(4, 3)[:, 0] - truth[:, 0])) > 0.1 * truth[:, 0].min()
    np.testing.assert_allclose(guarded.reshape(4, 3), truth, rtol=1e-4, atol=1e-6)
    centered = (rows - rows.mean(axis=1, keepdims=True)).reshape(64, 3)
    expected = 2.0 * centered / 16 * np.array([1.0, 2.0, 3.0])
    # float32 keeps a height of 1000 to ulp(1000) and its graph's mean to a few of them,
    # so a deviation near 0 is known to that: 2 (x - mean) / 16 to 8 ulp / 16.
    atol = 8 * float(np.spacing(np.float32(1000.0))) / 16
    np.testing.assert_allclose(gradient, expected, rtol=1e-3, atol=atol)
    assert [s.op_type for s in sites(layer)] == ["Sub"]


def test_the_printed_segment_fix_runs_and_gives_the_guarded_variance(tmp_path):
    text = (
        "from keras import ops\n\n\ndef variance(h, graph, count):\n"
        "    mean = ops.segment_sum(h, graph, 4) / count\n"
        "    return ops.segment_sum(ops.square(h), graph, 4) / count - ops.square(mean)\n"
    )
    ids = tf.constant(IDS)
    fix, guarded, pasted = _pasted_back(
        tmp_path / "graph_norm.py", text, lambda n, h: n["variance"](h, ids, _count(ids))
    )
    assert "ops.take(mean, graph, axis=0)" in fix.after
    np.testing.assert_allclose(pasted, guarded, rtol=1e-6)


@pytest.mark.parametrize("spelling", sorted(SEGMENT_SPELLINGS))
def test_an_eager_segment_variance_is_recognized_from_the_callback_s_record(spelling):
    """Eagerly (the doctor's check batch), each side's counts and ids are tensors of their
    own: the guard compares them by value, and records that it changed the variance."""
    layer = Variance(SEGMENT_SPELLINGS[spelling])
    guard_layer(layer, GUARD)
    layer(tf.constant(_features()))
    [site] = sites(layer)
    assert site.changed is True and site.file == __file__


def test_an_empty_segment_keeps_the_user_s_div_no_nan():
    """Five segments, the last empty (a graph with no nodes): divide_no_nan gives it a
    variance of 0, and so must the guarded variance, not 0/0."""

    def variance(x):
        count = tf.math.unsorted_segment_sum(tf.ones_like(IDS, tf.float32), IDS, 5)[:, None]
        mean = tf.math.divide_no_nan(tf.math.unsorted_segment_sum(x, IDS, 5), count)
        squares = tf.math.divide_no_nan(tf.math.unsorted_segment_sum(x * x, IDS, 5), count)
        return squares - tf.square(mean)

    layer = Variance(variance)
    guard_layer(layer, GUARD)
    guarded, _ = _traced(layer, _features())
    truth = _features().astype(np.float64).reshape(4, 16, 3).var(axis=1)
    np.testing.assert_allclose(guarded.reshape(5, 3)[:4], truth, rtol=1e-4, atol=1e-6)
    np.testing.assert_array_equal(guarded.reshape(5, 3)[4], 0.0)
    assert [s.op_type for s in sites(layer)] == ["Sub"]
