"""The segmented guards (``guard_exp_segment_shift``, ``guard_softmax_segment``): an op's
rows grouped by the ids of the segment sum its output feeds, found by tracing the layer's
call once, whether the ids are an argument of the call or built in it."""

import keras
import numpy as np
import tensorflow as tf

from stability.doctor.code_fix import code_fixes
from stability.model.op_guard import guard_layer, guard_named, sites

#: Six edges into three nodes (0, 1, 2); node 3 has none. The edge into node 0 with
#: logit 400 is the "high variance between indices" of pyg#2013.
LOGITS = [[1.0], [2.0], [400.0], [1.0], [3.0], [0.5]]
RECEIVERS = [1, 1, 0, 2, 2, 2]


def global_max_softmax(x, ids, n):
    """PyG's utils.softmax after #1707: one max for the whole batch."""
    out = tf.exp(x - tf.reduce_max(x))
    return out / (tf.gather(tf.math.unsorted_segment_sum(out, ids, n), ids) + 1e-16)


class Attention(keras.layers.Layer):
    """Weights ``[num_edges, 1]`` from logits by ``normalize``, then their sum per
    receiver ``[num_nodes, 1]`` (what must be 1 at a node with edges)."""

    def __init__(self, normalize, cast_ids=False, **kwargs):
        super().__init__(**kwargs)
        self.normalize, self.cast_ids = normalize, cast_ids

    def call(self, logits, receivers):
        # Ids built in the call (a cast) rather than passed in: the guard reads its own op.
        ids = tf.cast(receivers, tf.int64) if self.cast_ids else receivers
        alpha = self.normalize(logits, ids, 4)
        return tf.math.unsorted_segment_sum(alpha * tf.ones_like(logits), ids, 4)


def _sums(layer):
    run = tf.function(lambda x, r: layer(x, r))
    return run(tf.constant(LOGITS), tf.constant(RECEIVERS)).numpy().ravel()


def test_the_segment_shift_gives_each_nodes_weights_a_sum_of_1_where_one_max_gives_0():
    raw = _sums(Attention(global_max_softmax))
    assert raw[1] < 1e-6 and raw[2] < 1e-6, "guards the test: the far segments underflow"
    for cast_ids in (False, True):
        layer = Attention(global_max_softmax, cast_ids=cast_ids)
        guard_layer(layer, guard_named("guard_exp_segment_shift"))
        np.testing.assert_allclose(_sums(layer), [1.0, 1.0, 1.0, 0.0], rtol=1e-6)
        assert [s.op_type for s in sites(layer)] == ["Exp"]


def test_the_segment_softmax_normalizes_over_each_nodes_edges_not_the_last_axis():
    """Graph-Learn's GATConv: ``tf.nn.softmax`` of ``[num_edges, 1]`` scores, every weight 1."""
    raw = _sums(Attention(lambda x, ids, n: tf.nn.softmax(x)))
    np.testing.assert_allclose(raw, [1.0, 2.0, 3.0, 0.0])  # guards the test: the in-degree
    layer = Attention(lambda x, ids, n: tf.nn.softmax(x))
    guard_layer(layer, guard_named("guard_softmax_segment"))
    np.testing.assert_allclose(_sums(layer), [1.0, 1.0, 1.0, 0.0], rtol=1e-6)


def test_the_segment_softmax_equals_a_stable_segment_softmax_and_its_gradient():
    def stable(x, ids, n):
        top = tf.gather(tf.math.unsorted_segment_max(x, ids, n), ids)
        e = tf.exp(x - top)
        return e / tf.gather(tf.math.unsorted_segment_sum(e, ids, n), ids)

    x = tf.constant([[1.0], [2.0], [5.0], [1.0], [3.0], [0.5]])
    weights = tf.constant([[1.0], [2.0], [3.0], [4.0], [5.0], [6.0]])

    def value_and_gradient(normalize_layer):
        @tf.function
        def run(x):
            with tf.GradientTape() as tape:
                tape.watch(x)
                alpha = normalize_layer(x, tf.constant(RECEIVERS))
                total = tf.reduce_sum(alpha)
            return alpha, tape.gradient(total, x)

        return [t.numpy() for t in run(x)]

    class Weighted(Attention):
        def call(self, logits, receivers):
            alpha = self.normalize(logits, receivers, 4)
            return tf.math.unsorted_segment_sum(alpha * weights, receivers, 4)

    expected = value_and_gradient(Weighted(stable))
    guarded = Weighted(lambda x, ids, n: tf.nn.softmax(x))
    guard_layer(guarded, guard_named("guard_softmax_segment"))
    for got, want in zip(value_and_gradient(guarded), expected, strict=True):
        # The guard's max is a constant to the tape, the reference's is not: their
        # gradients agree to float32's rounding, not bit for bit.
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-6)


def test_an_exp_that_feeds_no_segment_sum_is_left_alone():
    class Gaussian(keras.layers.Layer):
        def call(self, logits, receivers):
            return tf.reduce_sum(tf.exp(-logits * logits))  # no segments: a plain sum

    gaussian = Gaussian()
    guard_layer(gaussian, guard_named("guard_exp_segment_shift"))
    tf.function(lambda x, r: gaussian(x, r))(tf.constant(LOGITS), tf.constant(RECEIVERS))
    assert not sites(gaussian)
    # The same exp summed by segment (the attention's own sum) is guarded.
    layer = Attention(lambda x, ids, n: tf.exp(-x * x) * tf.ones_like(x))
    guard_layer(layer, guard_named("guard_exp_segment_shift"))
    _sums(layer)
    assert [s.op_type for s in sites(layer)] == ["Exp"]


def test_the_fix_as_code_names_the_ids_the_user_wrote(tmp_path):
    path = tmp_path / "attention.py"
    path.write_text(
        "import tensorflow as tf\n"
        "def normalize(x, index, n):\n"
        "    out = tf.exp(x - tf.reduce_max(x))\n"
        "    return out / tf.gather(tf.math.unsorted_segment_sum(out, index, n), index)\n",
        encoding="utf-8",
    )
    namespace: dict = {}
    exec(compile(path.read_text(), str(path), "exec"), namespace)
    layer = Attention(namespace["normalize"])
    guard_layer(layer, guard_named("guard_exp_segment_shift"))
    _sums(layer)
    [fix] = code_fixes(sites(layer), "float32")
    assert fix.before == "out = tf.exp(x - tf.reduce_max(x))"
    assert fix.after == (
        "out = tf.exp(x - tf.reduce_max(x) - tf.stop_gradient(tf.gather("
        "tf.math.unsorted_segment_max(x - tf.reduce_max(x), index, tf.reduce_max(index) + 1), "
        "index)))"
    )


def test_the_segment_softmax_fix_as_code_runs_and_normalizes_each_node(tmp_path):
    """The printed line is code a user pastes: the file with it in place of the old line
    gives weights that sum to 1 at each node with edges, as the guarded layer does."""
    source = (
        "import tensorflow as tf\n"
        "def normalize(scores, receivers, n):\n"
        "    return tf.nn.softmax(scores)\n"
        "def aggregate(scores, receivers, n):\n"
        "    alpha = normalize(scores, receivers, n)\n"
        "    return tf.math.unsorted_segment_sum(alpha, receivers, n)\n"
    )
    path = tmp_path / "gat.py"
    path.write_text(source, encoding="utf-8")
    namespace: dict = {}
    exec(compile(source, str(path), "exec"), namespace)

    class Aggregate(keras.layers.Layer):
        def call(self, logits, receivers):
            return namespace["aggregate"](logits, receivers, 4)

    layer = Aggregate()
    guard_layer(layer, guard_named("guard_softmax_segment"))
    guarded = tf.function(lambda x, r: layer(x, r))(tf.constant(LOGITS), tf.constant(RECEIVERS))
    [fix] = code_fixes(sites(layer), "float32")
    assert "receivers" in fix.after and "SEGMENT_IDS" not in fix.after, fix.after
    fixed: dict = {}
    exec(source.replace(fix.before, fix.after), fixed)
    sums = fixed["aggregate"](tf.constant(LOGITS), tf.constant(RECEIVERS), 4).numpy().ravel()
    np.testing.assert_allclose(sums, [1.0, 1.0, 1.0, 0.0], rtol=1e-6)
    np.testing.assert_allclose(guarded.numpy().ravel(), sums, rtol=1e-6)
