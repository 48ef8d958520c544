"""A user's own Keras GNN (issue 26): built from the data before its step is made, checked
on a real batch before any run trains, and named in a failure as the user named it.

The models here are written as a user writes them (``keras.Model`` subclasses that create
their weights on the first call); examples/my_gat.py is the same through a case file.
"""

import dataclasses
import sys
from pathlib import Path

import keras
import numpy as np
import pytest
import tensorflow as tf
from conftest import run_cli

from stability import Recipe, StabilityError, TrainConfig, Trainer, Variant
from stability.compat.keras_layers import layer_names
from stability.data import load_dataset
from stability.train.failing_op import layer_path
from stability.train.replay import replay_step

ROOT = Path(__file__).resolve().parent.parent
CONFIG = TrainConfig(seed=0, batch_size=16, learning_rate=1e-2, epochs=3, hidden=8, dtype="float32")


class Pooled(keras.Model):
    """Embed, one naive exp/sum attention over the edges, mean per graph, a dense head;
    every op in the model's own ``call``. ``outputs`` sets the head's width."""

    def __init__(self, hidden, outputs=2, layer_dtype=None, **kwargs):
        super().__init__(**kwargs)
        extra = {"dtype": layer_dtype} if layer_dtype else {}
        self.embed = keras.layers.Dense(hidden, activation="relu", **extra)
        self.score = keras.layers.Dense(1, **extra)
        self.head = keras.layers.Dense(outputs, **extra)

    def call(self, inputs):
        h = self.embed(inputs["nodes"])
        senders, receivers = inputs["senders"], inputs["receivers"]
        num_nodes = tf.shape(h)[0]
        edges = tf.cast(inputs["edges"], h.dtype)
        score = tf.squeeze(self.score(tf.concat([tf.gather(h, senders), edges], -1)), -1)
        weight = tf.exp(score)
        alpha = weight / tf.gather(
            tf.math.unsorted_segment_sum(weight, receivers, num_nodes), receivers
        )
        h = h + tf.math.unsorted_segment_sum(
            alpha[:, None] * tf.gather(h, senders), receivers, num_nodes
        )
        pooled = tf.math.unsorted_segment_mean(h, inputs["node_graph"], inputs["num_graphs"])
        return self.head(pooled)


def variant(**model_options):
    def build(ctx):
        return Recipe(Pooled(ctx.hidden, **model_options), keras.optimizers.Adam(ctx.learning_rate))

    return Variant("users_model", "a user's subclassed model", build)


def dataset(max_distance=4.0, **params):
    return load_dataset(
        "generated",
        seed=0,
        num_graphs=40,
        min_distance=0.5,
        max_distance=max_distance,
        max_outlier=max(40.0, max_distance),
        **params,
    )


def test_a_subclassed_model_built_on_its_first_call_trains():
    result = Trainer(variant(), dataset(), CONFIG).run()
    assert result.first_nan_epoch is None
    grads = [r.grad_norm for r in result.history]
    maes = [r.val_mae for r in result.history]
    # Before the probe the step held no weights: grad_norm 0 and one MAE in every epoch.
    assert all(g > 0 for g in grads), grads
    assert all(np.isfinite(r.max_abs_weight) for r in result.history)
    assert len(set(maes)) == len(maes), maes


def test_its_naive_softmax_overflows_on_far_edges_and_is_named_in_its_own_model():
    model_name = "my_own_gnn"

    def build(ctx):
        model = Pooled(ctx.hidden, name=model_name)
        return Recipe(model, keras.optimizers.Adam(ctx.learning_rate))

    far = dataset(max_distance=5000.0, distribution="uniform")
    result = Trainer(Variant("users_model", "", build), far, CONFIG).run()
    assert result.first_nan_where == "forward"
    # Every op of the softmax is in the model's own call: named by the model, once.
    assert result.first_nan_layer == model_name
    assert result.first_nan_op.split()[0] in {"Exp", "RealDiv"}, result.first_nan_op
    assert result.failure_cause.startswith("forward")


def test_a_wrong_output_shape_is_one_line_before_any_training(tmp_path):
    # The robust loss needs mean and log sigma; this head gives one value per graph.
    with pytest.raises(StabilityError) as caught:
        Trainer(variant(outputs=1), dataset(), CONFIG).build()
    message = str(caught.value)
    assert "[4, 1]" in message and "[num_graphs, 2]" in message and "\n" not in message


def test_a_model_that_fails_on_a_batch_is_one_line_naming_the_op():
    class Mixed(Pooled):
        def call(self, inputs):  # float32 nodes beside float64 edges: the concat fails
            h = self.embed(inputs["nodes"])
            return tf.concat([h, tf.cast(h, tf.float64)], axis=-1)

    def build(ctx):
        return Recipe(Mixed(ctx.hidden), keras.optimizers.Adam(ctx.learning_rate))

    with pytest.raises(StabilityError) as caught:
        Trainer(Variant("mixed", "", build), dataset(), CONFIG).build()
    message = str(caught.value)
    assert "ConcatV2" in message and "\n" not in message and "\x1b" not in message, message


def test_a_model_with_no_weight_is_refused():
    class Constant(keras.Model):
        def call(self, inputs):
            return tf.zeros([inputs["num_graphs"], 2])

    def build(ctx):
        return Recipe(Constant(), keras.optimizers.Adam(ctx.learning_rate))

    with pytest.raises(StabilityError, match="no trainable weights"):
        Trainer(Variant("constant", "", build), dataset(), CONFIG).build()


def test_a_model_whose_weights_the_loss_never_reaches_is_refused():
    class Detached(Pooled):
        def call(self, inputs):
            super().call(inputs)
            return tf.stop_gradient(tf.zeros([inputs["num_graphs"], 2]))

    def build(ctx):
        return Recipe(Detached(ctx.hidden), keras.optimizers.Adam(ctx.learning_rate))

    with pytest.raises(StabilityError, match="gets a gradient"):
        Trainer(Variant("detached", "", build), dataset(), CONFIG).build()


def test_layers_without_a_dtype_follow_a_float64_run_and_a_float32_layer_is_refused():
    config = dataclasses.replace(CONFIG, dtype="float64", epochs=1)
    recipe = Trainer(variant(), dataset(), config).build()
    assert {w.dtype for w in recipe.model.trainable_variables} == {"float64"}
    with pytest.raises(StabilityError, match="float32 in a float64 case"):
        Trainer(variant(layer_dtype="float32"), dataset(), config).build()
    assert keras.config.dtype_policy().name == "float32"  # the global policy is restored


def test_a_gradient_failure_in_a_dense_head_names_its_forward_op():
    # A head kernel of 1e-5 and a loss of 1e30 * prediction: the forward pass stays finite
    # (about 1e25 * |x|), the kernel's gradient 1e30 * x overflows for |x| above 3.4e8.
    class Head(keras.Model):
        def __init__(self):
            super().__init__()
            self.head = keras.layers.Dense(2, kernel_initializer=keras.initializers.Constant(1e-5))

        def call(self, inputs):
            pooled = tf.math.unsorted_segment_sum(
                inputs["nodes"], inputs["node_graph"], inputs["num_graphs"]
            )
            return self.head(pooled)

    model = Head()
    nodes = np.full([3, 2], 1e9, np.float32)
    inputs = {
        "nodes": tf.constant(nodes),
        "node_graph": tf.constant([0, 0, 1]),
        "num_graphs": tf.constant(2),
    }
    model(inputs)
    site = replay_step(model, lambda predictions: 1e30 * tf.reduce_sum(predictions), inputs)
    assert site.where == "gradient"
    assert site.layer == model.head.name
    # The tape puts tf.matmul's gradient ops in the scope the forward MatMul opened.
    assert site.op.startswith("MatMul (MatMul) gradient: MatMul"), site.op


@pytest.mark.parametrize(
    ("scopes", "path"),
    [
        (["my_gat_1", "edge_attention", "dense_1"], "edge_attention/dense_1"),
        (["my_gat_1"], "my_gat"),
        (["message_passing_0", "net"], "message_passing_0/net"),
        (["stability_loss"], None),
    ],
)
def test_the_layer_path_names_the_model_once(scopes, path):
    known = {"edge_attention", "dense_1", "message_passing_0", "net"}
    assert layer_path(scopes, known, "my_gat") == path


def test_the_example_gnn_trains_through_its_case_file(tmp_path, isolated_registries):
    """examples/my_gat.py through examples/my_gat.toml: on the seed's distances it trains;
    with the case's far outliers its naive softmax fails in one of its attention layers."""
    sys.path.insert(0, str(ROOT / "examples"))
    try:
        from my_gat import MyGAT
    finally:
        sys.path.remove(str(ROOT / "examples"))
    attention = {
        name for name in layer_names(_built(MyGAT(8))) if name.startswith("edge_attention")
    }
    tiny = [
        # The far outliers overflow float32's exp (88.7), not float64's (709.8): the example
        # is run in the dtype it is about, whatever STABILITY_DTYPE the matrix cell sets.
        "--set",
        'dtype="float32"',
        "--set",
        "epochs=4",
        "--set",
        "seeds=[0]",
        "--set",
        "dataset.num_graphs=48",
        "--no-progress",
    ]
    for label, extra in [("near", ["--set", "dataset.max_outlier=4.0"]), ("far", [])]:
        out = tmp_path / label
        # In this process (conftest.run_cli): the command line's path without a second
        # TensorFlow start; tests/test_examples.py runs the walkthrough in a real process.
        done = run_cli(
            "run",
            str(ROOT / "examples" / "my_gat.toml"),
            *("--variants", "my_gat", "--out", str(out)),
            *tiny,
            *extra,
            cwd=tmp_path,
        )
        assert done.returncode == 0, done.stderr[-2000:]
        import pandas as pd

        row = pd.read_csv(out / "my_gat.csv").iloc[0]
        history = pd.read_csv(out / "my_gat.history.csv")
        if label == "near":
            assert pd.isna(row.first_nan_epoch)
            assert (history.grad_norm > 0).all() and history.val_mae.nunique() == len(history)
        else:
            assert row.first_nan_where == "forward"
            assert row.first_nan_layer in attention, (row.first_nan_layer, attention)
            assert row.first_nan_op.split()[0] in {"Exp", "RealDiv"}


def _built(model):
    data = dataset()
    from stability.data.graphs import batch_graphs

    model(batch_graphs(data.train[:2]).as_inputs())
    return model


WRONG_SHAPE_PLUGIN = '''
import keras
import tensorflow as tf
from stability import Recipe, register_variant


class OneOutput(keras.Model):
    def __init__(self, hidden):
        super().__init__()
        self.embed = keras.layers.Dense(hidden)
        self.head = keras.layers.Dense(1)

    def call(self, inputs):
        h = self.embed(inputs["nodes"])
        pooled = tf.math.unsorted_segment_mean(h, inputs["node_graph"], inputs["num_graphs"])
        return self.head(pooled)


@register_variant
def one_output(ctx):
    """a head of one output where the robust loss needs two"""
    return Recipe(OneOutput(ctx.hidden), keras.optimizers.Adam(ctx.learning_rate))
'''


def test_a_wrong_output_shape_from_the_command_line_is_exit_2_and_no_rows(
    tmp_path, capsys, isolated_registries
):
    from stability import cli

    (tmp_path / "one_output.py").write_text(WRONG_SHAPE_PLUGIN)
    case = tmp_path / "case.toml"
    case.write_text(
        'plugins = ["one_output.py"]\nvariants = ["raw_e", "one_output"]\nseeds = [0]\n'
        'epochs = 2\n[dataset]\nname = "generated"\nnum_graphs = 24\n'
    )
    code = cli.main(["run", str(case), "--out", str(tmp_path / "out"), "--no-progress"])
    err = capsys.readouterr().err.strip()
    assert code == 2
    assert err.count("\n") == 0, err
    assert "'one_output'" in err and "[num_graphs, 2]" in err and ", 1]" in err, err
    assert not (tmp_path / "out" / "case.csv").exists()  # raw_e, listed first, never trained
