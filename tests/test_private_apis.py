"""The private APIs and behaviours of other libraries, each isolated in one module
(``keras_layers``, ``keras_private``, ``tf_private``, ``hypothesis_engine``): these fail
loudly when a TensorFlow, Keras or Hypothesis release changes them, instead of letting a run
misname a layer or draw other data."""

import importlib
import random

import keras
import numpy as np
import pytest
import tensorflow as tf
from hypothesis import strategies as st

from stability.compat.hypothesis_engine import PRIVATE_API as HYPOTHESIS_PRIVATE
from stability.compat.hypothesis_engine import draw
from stability.compat.keras_layers import PRIVATE_API as KERAS_PRIVATE
from stability.compat.keras_layers import layer_names
from stability.compat.keras_private import COMPUTE_LOSS_ARGS, is_slot_of, slot_name
from stability.compat.tf_private import (
    GRADIENT_SCOPE,
    captured_handles,
    disable_op_determinism,
    error_first_input,
    error_node,
    error_op_type,
    is_gradient_op,
    op_callback_first,
    op_determinism_enabled,
    record_identity,
    strip_uniquifier,
)
from stability.model.network import GraphNetwork
from stability.train.failing_op import failing_node


def test_keras_private_layer_walk_exists_and_finds_nested_layers():
    assert hasattr(keras.layers.Layer, KERAS_PRIVATE), f"keras.Layer.{KERAS_PRIVATE} is gone"
    model = GraphNetwork(num_features=3, hidden=8, num_layers=2)
    names = layer_names(model)
    # Nested layers (each pass's Net) must be found, not only the top level.
    assert {"message_passing_0", "message_passing_1", "net"} <= names, names


def test_hypothesis_private_names_exist():
    for module, attribute in HYPOTHESIS_PRIVATE:
        try:
            owner = importlib.import_module(module)
        except ModuleNotFoundError:
            parent, _, cls = module.rpartition(".")
            owner = getattr(importlib.import_module(parent), cls)
        assert hasattr(owner, attribute), f"{module}.{attribute} is gone from Hypothesis"


def test_seeded_draw_depends_on_the_seed_only():
    strategy = st.lists(st.floats(0, 1000, allow_nan=False), min_size=5, max_size=20)
    first = draw(strategy, seed="x/1")
    random.seed(12345)  # the global Random must not matter
    assert draw(strategy, seed="x/1") == first
    others = {tuple(draw(strategy, seed=f"x/{i}")) for i in range(2, 12)}
    assert len(others) > 1, "different seeds drew the same value every time"


# --- TensorFlow's and Keras' private behaviour, each contract exercised (tf_private,
# keras_private): a release that changes one fails here, by name.


def _check_numerics_error(fn, *args):
    traced = tf.function(fn)
    tf.debugging.enable_check_numerics()
    try:
        traced(*args)
    except tf.errors.InvalidArgumentError as error:
        return str(error), traced.get_concrete_function(*args).graph
    finally:
        tf.debugging.disable_check_numerics()
    raise AssertionError("guards the test: the planted op must fail the check")


def test_a_check_numerics_error_names_the_planted_op_its_type_and_its_input():
    def planted(x):
        with tf.name_scope("planted_layer"):
            return tf.math.log(x - 2.0)  # log of -1: NaN

    message, graph = _check_numerics_error(planted, tf.constant([1.0]))
    assert error_op_type(message) == "Log", message
    node = error_node(message) or failing_node(message, graph)
    assert node is not None and node.endswith("planted_layer/Log"), message
    if error_node(message) is None:  # no traceback attached: the input names the node
        assert error_first_input(message) is not None, message
    assert graph.get_operation_by_name(node).type == "Log"


def test_a_gradient_op_sits_in_the_tapes_scope_of_its_forward_op():
    weight = tf.Variable([2.0])

    @tf.function
    def gradient(x):
        with tf.GradientTape() as tape, tf.name_scope("layer"):
            y = tf.sqrt(x * weight)
        return tape.gradient(y, weight)

    graph = gradient.get_concrete_function(tf.constant([1.0])).graph
    names = [op.name for op in graph.get_operations()]
    assert any(is_gradient_op(n) and n.startswith(f"{GRADIENT_SCOPE}/layer/") for n in names), [
        n for n in names if is_gradient_op(n)
    ]


def test_an_op_with_a_scope_of_its_own_has_its_gradient_ops_in_a_scope_named_after_it():
    """``x / y`` opens scope ``truediv/`` and names its op ``truediv``; the tape puts that op's
    gradient ops in ``gradient_tape/layer/truediv/``, and ``acos``'s (an op with no scope of
    its own) in ``gradient_tape/layer/``: ``failing_op.forward_op_of`` tells them apart so."""
    weight = tf.Variable([2.0])

    @tf.function
    def gradient(x):
        with tf.GradientTape() as tape, tf.name_scope("layer"):
            y = tf.math.acos(x / weight)
        return tape.gradient(y, weight)

    graph = gradient.get_concrete_function(tf.constant([1.0])).graph
    ops = {op.name: op for op in graph.get_operations()}
    assert ops["layer/truediv"].type == "RealDiv" and ops["layer/Acos"].type == "Acos"
    scopes = {n.rsplit("/", 1)[0] for n, op in ops.items() if is_gradient_op(n)}
    assert f"{GRADIENT_SCOPE}/layer/truediv" in scopes, sorted(scopes)
    reciprocal = [n for n, op in ops.items() if is_gradient_op(n) and op.type == "Reciprocal"]
    assert reciprocal == [f"{GRADIENT_SCOPE}/layer/Reciprocal"], reciprocal


def test_a_scope_entered_twice_is_uniquified_with_a_suffix():
    @tf.function
    def twice(x):
        for _ in range(2):
            with tf.name_scope("block"):
                x = tf.exp(x)
        return x

    graph = twice.get_concrete_function(tf.constant(1.0)).graph
    scopes = {op.name.split("/")[0] for op in graph.get_operations() if op.type == "Exp"}
    assert scopes == {"block", "block_1"}, scopes
    assert {strip_uniquifier(s, {"block"}) for s in scopes} == {"block"}


def test_keras_enters_a_layers_scope_twice_so_sibling_layers_strip_to_their_own_names():
    """Two sibling layers of one class, ``twin`` and ``twin_1``: in a traced call their ops
    sit in ``twin_1`` and ``twin_1_2`` (each layer's scope is entered twice, and the first
    entry takes the plain name); ``strip_uniquifier`` maps each to its own layer."""

    class Twin(keras.layers.Layer):
        def call(self, x):
            return tf.exp(x)

    class Pair(keras.Model):
        def __init__(self):
            super().__init__(name="pair")
            self.first, self.second = Twin(name="twin"), Twin(name="twin_1")

        def call(self, x):
            return self.second(self.first(x))

    model = Pair()
    traced = tf.function(model).get_concrete_function(tf.constant([1.0]))
    exps = [op.name.split("/") for op in traced.graph.get_operations() if op.type == "Exp"]
    known = {"twin", "twin_1"}
    assert [strip_uniquifier(scope[-2], known) for scope in exps] == ["twin", "twin_1"], exps


def test_a_captured_variable_is_paired_with_its_placeholder():
    variable = tf.Variable([1.0])

    @tf.function
    def read():
        return variable * 2.0

    graph = read.get_concrete_function().graph
    handles = captured_handles(graph)
    assert any(external is variable.handle for external in handles.values())


def test_adam_names_a_weights_slots_after_its_path():
    layer = keras.layers.Dense(2, name="dense")
    layer.build((None, 3))
    optimizer = keras.optimizers.Adam()
    optimizer.build(layer.trainable_variables)
    kernel = layer.kernel
    slots = {slot_name(v, kernel) for v in optimizer.variables if is_slot_of(v, kernel)}
    assert slots == {"momentum", "velocity"}, [v.name for v in optimizer.variables]
    bias_slots = [v for v in optimizer.variables if is_slot_of(v, layer.bias)]
    assert len(bias_slots) == 2 and not any(is_slot_of(v, kernel) for v in bias_slots)


def test_train_step_passes_compute_loss_its_arguments_in_this_order():
    seen = {}

    class Recording(keras.Model):
        def __init__(self):
            super().__init__()
            self.dense = keras.layers.Dense(1)

        def call(self, x):
            return self.dense(x)

        def compute_loss(self, *args, **kwargs):
            seen.update(dict(zip(COMPUTE_LOSS_ARGS, args, strict=False)))
            return super().compute_loss(*args, **kwargs)

    model = Recording()
    model.compile(keras.optimizers.SGD(), "mse")
    x, y = np.ones((4, 3), "float32"), np.zeros((4, 1), "float32")
    model.fit(x, y, epochs=1, batch_size=4, verbose=0)
    assert set(seen) == set(COMPUTE_LOSS_ARGS), seen
    assert seen["x"].shape[-1] == 3 and seen["y"].shape[-1] == 1
    assert seen["y_pred"].shape[-1] == 1


def _sqrt_floor(op_type, inputs, attrs, outputs, op_name=None, graph=None):
    if op_type != "Sqrt":
        return None  # op_callback_first hands the outputs on unchanged
    return [tf.sqrt(tf.maximum(inputs[0], 1e-6))]


def test_an_op_callback_replaces_an_op_in_the_trace_and_the_gradient_follows():
    def distance_gradient(p):
        with tf.GradientTape() as tape:
            tape.watch(p)
            y = tf.reduce_sum(tf.sqrt(tf.reduce_sum(tf.square(p), axis=-1)))
        return tape.gradient(y, p)

    at_zero = tf.zeros([2, 3])
    assert np.isnan(tf.function(distance_gradient)(at_zero).numpy()).all()  # sqrt'(0) * 0
    with op_callback_first(_sqrt_floor):
        guarded = tf.function(distance_gradient)(at_zero).numpy()
    assert np.isfinite(guarded).all(), guarded
    # Gone with the block: a fresh trace builds the raw op again.
    assert np.isnan(tf.function(distance_gradient)(at_zero).numpy()).all()


def test_an_op_callback_added_first_runs_before_check_numerics():
    tf.debugging.enable_check_numerics()
    try:
        with op_callback_first(_sqrt_floor):
            value = tf.function(lambda x: tf.sqrt(x))(tf.constant([-1.0]))  # NaN unguarded
        assert np.isfinite(value.numpy()).all()
    finally:
        tf.debugging.disable_check_numerics()


@pytest.mark.parametrize("record", [False, True])
def test_the_tape_records_a_callbacks_outputs_as_the_raw_ops_until_recorded_again(record):
    """TensorFlow records an op's replaced outputs as made by the raw op from its raw inputs
    (Log's gradient 1 / x at x = 0: NaN); ``record_identity`` afterwards makes the tape
    differentiate the replacement instead."""
    made = []

    def log_floor(op_type, inputs, attrs, outputs, op_name=None, graph=None):
        if op_type != "Log" or made:
            return None
        guarded = tf.math.log(tf.maximum(inputs[0], 1e-30))
        made.append(([tf.identity(guarded)], [guarded]))
        return made[-1][0]

    weight = tf.Variable([1.0, 1.0])

    @tf.function
    def gradient(x):
        with tf.GradientTape() as tape:
            with op_callback_first(log_floor):
                y = tf.math.log(weight * x)
            if record:
                record_identity(*made[-1])
            total = tf.reduce_sum(y)
        return tape.gradient(total, weight)

    value = gradient(tf.constant([0.0, 2.0])).numpy()
    assert np.isfinite(value[1])
    assert np.isfinite(value[0]) == record, value


def test_op_determinism_can_be_read_and_turned_off_again():
    was = op_determinism_enabled()
    try:
        tf.config.experimental.enable_op_determinism()
        assert op_determinism_enabled()
        disable_op_determinism()
        assert not op_determinism_enabled()
    finally:
        if was:
            tf.config.experimental.enable_op_determinism()


def test_every_compat_module_is_tested_here_and_listed_in_the_docs():
    """One place for other libraries' private behaviour: each module of ``stability.compat``
    is imported by this file and has a row in docs/architecture.md's table."""
    import ast
    from pathlib import Path

    import stability.compat

    folder = Path(stability.compat.__file__).parent
    modules = {f"stability.compat.{p.stem}" for p in folder.glob("*.py") if p.stem != "__init__"}
    tree = ast.parse(Path(__file__).read_text(encoding="utf-8"))
    imported = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module} | {
        a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names
    }
    docs = (Path(__file__).parents[1] / "docs" / "architecture.md").read_text(encoding="utf-8")
    assert sorted(modules - imported) == [], "compat modules this file does not exercise"
    assert sorted(m for m in modules if f"| `{m}` |" not in docs) == [], "not in the docs"
