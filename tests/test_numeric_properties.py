"""Properties of the numerics, each checked on Hypothesis-drawn inputs against float64 NumPy.

Each property is built by a small factory so that the same property can also be run against
a planted bug (a naive softmax where a stable one should be) and shown to fail with Hypothesis'
shrunk example in the message.
"""

import numpy as np
import pytest
import tensorflow as tf
from hypothesis import Phase, given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from stability import BuildContext, get_variant, register_variant
from stability.data.strategies import graphs
from stability.model import variants
from stability.model.softmax import get_softmax
from stability.model.variants import create_recipe
from stability.testing import assert_finite, assert_normalized

DTYPES = {"float16": np.float16, "float32": np.float32, "float64": np.float64}
#: log(largest finite value), computed in float64: exp overflows above it.
OVERFLOW = {
    name: float(np.log(np.finfo(dtype).max, dtype=np.float64)) for name, dtype in DTYPES.items()
}
WIDTH = {"float16": 16, "float32": 32, "float64": 64}


@st.composite
def segments(draw, *, min_logit: float, max_logit: float, dtype: str = "float32"):
    """(logits ``[num_edges]``, receivers ``[num_edges]``, num_nodes), some nodes isolated."""
    num_nodes = draw(st.integers(1, 8))
    num_edges = draw(st.integers(0, 24))
    receivers = draw(arrays(np.int32, num_edges, elements=st.integers(0, num_nodes - 1)))
    logits = draw(
        arrays(
            DTYPES[dtype],
            num_edges,
            elements=st.floats(min_logit, max_logit, width=WIDTH[dtype]),
        )
    )
    return logits, receivers, num_nodes


def reference_softmax(logits: np.ndarray, receivers: np.ndarray) -> np.ndarray:
    """The segment softmax in float64, max-subtracted."""
    logits = logits.astype(np.float64)
    out = np.zeros_like(logits)
    for node in np.unique(receivers):
        mask = receivers == node
        shifted = np.exp(logits[mask] - logits[mask].max())
        out[mask] = shifted / shifted.sum()
    return out


def softmax_and_gradient(softmax, logits, receivers, num_nodes, messages):
    """alpha ``[num_edges]``, d sum(alpha * messages) / d logits ``[num_edges]`` and the
    per-node sums of alpha * messages ``[num_nodes]``."""
    a = tf.constant(logits.reshape(-1, 1))
    r = tf.constant(receivers)
    with tf.GradientTape() as tape:
        tape.watch(a)
        alpha = softmax(a, r, tf.constant(num_nodes))
        weighted = alpha[:, 0] * tf.constant(messages, a.dtype)
        objective = tf.reduce_sum(weighted)
    gradient = tape.gradient(objective, a)
    received = tf.math.unsorted_segment_sum(weighted, r, num_nodes)
    return (
        alpha.numpy().ravel(),
        gradient.numpy().ravel(),
        received.numpy(),
    )


def matches_reference_property(softmax):
    """The softmax matches float64 for logits in [-1e4, 1e4], sums to 1 over non-empty
    segments, has finite gradients, and gives isolated nodes a zero message."""

    @given(data=segments(min_logit=-1e4, max_logit=1e4), seed=st.integers(0, 2**16))
    def check(data, seed):
        logits, receivers, num_nodes = data
        messages = np.random.default_rng(seed).uniform(-1, 1, logits.size).astype(np.float32)
        alpha, gradient, received = softmax_and_gradient(
            softmax, logits, receivers, num_nodes, messages
        )
        expected = reference_softmax(logits, receivers)
        np.testing.assert_allclose(alpha, expected, rtol=1e-5, atol=1e-6)
        has_edges = np.isin(np.arange(num_nodes), receivers)
        assert_normalized(alpha, receivers, num_nodes)
        assert_finite(gradient, "gradient")
        mean_message = np.zeros(num_nodes)
        np.add.at(mean_message, receivers, expected * messages)
        np.testing.assert_allclose(
            gradient, expected * (messages - mean_message[receivers]), atol=1e-5
        )
        assert (received[~has_edges] == 0).all(), f"isolated nodes got {received[~has_edges]}"

    return check


def test_stable_softmax_matches_float64_reference():
    matches_reference_property(get_softmax("stable"))()


#: How Hypothesis introduces the shrunk example in a failure's notes.
SHRUNK = "Failing test case"


def notes_of(error: BaseException) -> str:
    return "\n".join(getattr(error, "__notes__", []))


#: Every phase but ``explain``: after the first failure it traces each later call line by
#: line (sys.settrace on Python 3.11), which tripled the time of the shrinking below, and
#: the notes it adds are no part of the shrunk example these tests look for.
NO_EXPLAIN = tuple(phase for phase in Phase if phase is not Phase.explain)


#: A planted bug's search: stopping at its first distinct failure, so it raises that one
#: (shrunk).
PLANTED_RULES = {"report_multiple_bugs": False, "phases": NO_EXPLAIN}


def planted(check):
    """``check`` with ``PLANTED_RULES``."""
    return settings(**PLANTED_RULES)(check)


def test_the_reference_property_catches_a_naive_softmax():
    with pytest.raises(AssertionError) as failure:
        planted(matches_reference_property(get_softmax("naive")))()
    assert SHRUNK in notes_of(failure.value), notes_of(failure.value)


@pytest.mark.parametrize("dtype", list(DTYPES))
def test_naive_softmax_is_nonfinite_exactly_above_log_max(dtype):
    """Non-finite iff some logit exceeds log(dtype max). Logits stay above log(smallest
    normal), so no segment underflows to 0 / 0 (a different failure, tested elsewhere)."""
    kind = DTYPES[dtype]
    # Bounds rounded to the dtype, since Hypothesis wants them exactly representable.
    low = float(kind(np.log(np.finfo(kind).tiny, dtype=np.float64) + 1.0))
    high = float(kind(2.0 * OVERFLOW[dtype]))

    @given(data=segments(min_logit=low, max_logit=high, dtype=dtype))
    def check(data):
        logits, receivers, num_nodes = data
        alpha, *_ = softmax_and_gradient(
            get_softmax("naive"), logits, receivers, num_nodes, np.ones(logits.size)
        )
        overflows = bool((logits.astype(np.float64) > OVERFLOW[dtype]).any())
        assert (not np.isfinite(alpha).all()) == overflows, (
            f"max logit {logits.max() if logits.size else None!r} vs log max "
            f"{OVERFLOW[dtype]!r}: alpha {alpha}"
        )

    check()


@pytest.mark.parametrize("dtype", list(DTYPES))
def test_naive_softmax_threshold_from_both_sides(dtype):
    """The representable logits just below and just above log(dtype max)."""
    kind = DTYPES[dtype]
    below = kind(OVERFLOW[dtype])
    while float(below) > OVERFLOW[dtype]:
        below = np.nextafter(below, kind(0))
    above = np.nextafter(below, kind(np.inf))
    assert float(below) <= OVERFLOW[dtype] < float(above)
    naive = get_softmax("naive")
    receivers = np.zeros(2, np.int32)
    ok, *_ = softmax_and_gradient(naive, np.array([below, 0], kind), receivers, 1, np.ones(2))
    bad, *_ = softmax_and_gradient(naive, np.array([above, 0], kind), receivers, 1, np.ones(2))
    assert np.isfinite(ok).all(), f"{dtype}: logit {float(below)!r} overflowed: {ok}"
    assert not np.isfinite(bad).all(), f"{dtype}: logit {float(above)!r} stayed finite: {bad}"


@pytest.mark.parametrize(
    ("dtype", "printed"), [("float16", 11.09), ("float32", 88.72), ("float64", 709.78)]
)
def test_overflow_thresholds_are_the_documented_ones(dtype, printed):
    assert round(OVERFLOW[dtype], 2) == printed


# --- the seed's layer ---------------------------------------------------------------------

HIDDEN = 4  # the one-hot node types of the drawn graphs are the node states


@pytest.fixture
def planted_variant(monkeypatch):
    """A test-only variant, registered through the public decorator for this test alone: a
    naive softmax planted where stable_softmax's stable one should be."""
    # There is no public unregister; other tests list the registry, so register into a copy.
    monkeypatch.setattr(variants, "_variants", variants._variants.copy())

    @register_variant(description="test only: stable_softmax with a naive softmax planted in it")
    def planted_naive_in_stable_softmax(ctx: BuildContext):
        return create_recipe(ctx, softmax="naive")

    return "planted_naive_in_stable_softmax"


def message_passing_layer(variant: str):
    context = BuildContext(
        num_features=HIDDEN,
        hidden=HIDDEN,
        num_layers=1,
        learning_rate=1e-2,
        edge_mean=0.0,
        edge_std=1.0,
    )
    tf.keras.utils.set_random_seed(0)
    return get_variant(variant).build(context).model.passes[0]


#: A quarter of the profile's examples (50 under "ci", 1250 under "thorough") for the
#: layer's property on the planted naive softmax: each example runs the layer and its
#: gradients eagerly, and the planted bug fails within the first few. The healthy layer
#: keeps the profile's whole count: there, every example is a chance to fail.
LAYER_EXAMPLES = max(1, settings().max_examples // 4)


def finite_layer_property(layer, **rules):
    """The layer's output and the gradients of its weights are finite for any distance in
    [0, 1e3] and any weight scale up to 1e3 (with Hypothesis' ``rules`` over the
    profile's)."""
    initial = [w.numpy() for w in layer.trainable_variables]

    @settings(**rules)
    @given(
        graph=graphs(
            max_nodes=8,
            max_edges=24,
            num_types=HIDDEN,
            min_distance=0.0,
            max_distance=1e3,
            max_outlier=1e3,
        ),
        scale=st.floats(0.0, 1e3),
    )
    def check(graph, scale):
        for weight, value in zip(layer.trainable_variables, initial, strict=True):
            weight.assign(value * scale)
        with tf.GradientTape() as tape:
            nodes, logits, _ = layer(
                tf.constant(graph.nodes, tf.float32),
                tf.constant(graph.edges, tf.float32),
                tf.constant(graph.senders),
                tf.constant(graph.receivers),
            )
            objective = tf.reduce_sum(nodes)
        gradients = tape.gradient(objective, layer.trainable_variables)
        biggest = float(tf.reduce_max(tf.abs(logits))) if graph.num_edges else 0.0
        assert np.isfinite(nodes.numpy()).all(), f"output included NaNs; max |logit| {biggest:g}"
        for weight, gradient in zip(layer.trainable_variables, gradients, strict=True):
            assert np.isfinite(gradient.numpy()).all(), f"gradient of {weight.path} not finite"

    return check


def test_stable_softmax_layer_is_finite_for_large_distances_and_weights():
    finite_layer_property(message_passing_layer("stable_softmax"))()


def test_the_layer_property_catches_a_planted_naive_softmax(planted_variant):
    """The naive softmax's gradient can go NaN before its output does (exp(a) / s**2 with
    s**2 beyond float32), so either message is the planted bug showing."""
    layer = message_passing_layer(planted_variant)
    with pytest.raises(AssertionError, match=r"output included NaNs|not finite") as failure:
        finite_layer_property(layer, max_examples=LAYER_EXAMPLES, **PLANTED_RULES)()
    notes = notes_of(failure.value)
    assert SHRUNK in notes and "scale=" in notes, notes
