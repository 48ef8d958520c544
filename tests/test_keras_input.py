"""``keras_input``: a harness data set as the ``tf.data.Dataset`` of your own ``fit``, and
docs/testing.md's example of it, run as it stands."""

import re
from pathlib import Path

import numpy as np
import pytest

from stability import keras_input
from stability.core.errors import StabilityError
from stability.data import Dataset, load_dataset
from stability.data.graphs import Graph
from stability.train.step import input_signature
from stability.train.trainer import shuffled_batches

ROOT = Path(__file__).resolve().parent.parent
TESTING_DOC = ROOT / "docs" / "testing.md"
SECTION = "## Your graphs in your own `fit`"


@pytest.fixture(scope="module")
def data():
    return load_dataset("synthetic", seed=0, num_graphs=40, min_nodes=3, max_nodes=7)


def passes(dataset, epochs):
    """The elements of ``epochs`` passes over ``dataset`` (as ``fit`` makes them), in numpy."""
    out = []
    for _ in range(epochs):
        out.append([(_numpy(inputs), targets.numpy()) for inputs, targets in dataset])
    return out


def _numpy(inputs):
    return {name: value.numpy() for name, value in inputs.items()}


def test_the_training_batches_are_the_trainers_for_the_same_seed(data):
    scaled = (np.array([g.target for g in data.train]) - data.target_mean) / data.target_std
    rng = np.random.default_rng(7)
    expected = [list(shuffled_batches(data.train, scaled, 8, rng, "float32")) for _ in range(2)]
    got = passes(keras_input(data, "train", batch_size=8, seed=7), epochs=2)
    assert [len(epoch) for epoch in got] == [len(epoch) for epoch in expected]
    flat = [
        (mine, theirs)
        for a, b in zip(got, expected, strict=True)
        for mine, theirs in zip(a, b, strict=True)
    ]
    for mine, theirs in flat:
        batch = theirs[0]
        np.testing.assert_array_equal(mine[1], batch.targets)
        for name, value in batch.as_inputs().items():
            np.testing.assert_array_equal(mine[0][name], value, err_msg=name)
    first, second = ([t for _, t in epoch] for epoch in got)
    assert not all(np.array_equal(a, b) for a, b in zip(first, second, strict=True)), (
        "each epoch must be shuffled afresh"
    )


def test_validation_is_read_in_order_with_the_training_scale(data):
    (epoch,) = passes(keras_input(data, "val", batch_size=3), epochs=1)
    targets = np.concatenate([t for _, t in epoch])
    own = np.array([g.target for g in data.val])
    np.testing.assert_allclose(targets * data.target_std + data.target_mean, own, rtol=1e-5)
    assert [int(inputs["num_graphs"]) for inputs, _ in epoch][:-1] == [3] * (len(epoch) - 1)


def test_the_signature_is_the_trainers_and_the_length_is_known(data):
    dataset = keras_input(data, "train", batch_size=16, dtype="float64")
    assert dataset.element_spec == input_signature(data.num_features, "float64")
    assert int(dataset.cardinality()) == -(-len(data.train) // 16) == len(list(dataset))


def test_a_batch_without_edges_is_an_element_too():
    def graph(num_edges, target):
        return Graph(
            nodes=np.ones((2, 3)),
            edges=np.full((num_edges, 1), 1.5),
            senders=np.zeros(num_edges, np.int32),
            receivers=np.ones(num_edges, np.int32),
            target=target,
        )

    data = Dataset(key="edgeless", train=[graph(0, 1.0), graph(2, 2.0)], val=[graph(0, 3.0)])
    (epoch,) = passes(keras_input(data, "val", batch_size=1), epochs=1)
    inputs, _ = epoch[0]
    assert inputs["edges"].shape == (0, 1) and inputs["nodes"].shape == (2, 3)


@pytest.mark.parametrize(
    ("params", "message"),
    [
        ({"split": "test"}, "split='test' must be one of train, val"),
        ({"batch_size": 0}, "batch_size=0 must be an integer > 0"),
        ({"batch_size": 2.5}, "batch_size=2.5 must be an integer > 0"),
        ({"dtype": "int8"}, "dtype='int8' must be one of float32, float64, mixed_float16"),
    ],
)
def test_bad_arguments_are_one_line_naming_what_is_accepted(data, params, message):
    with pytest.raises(StabilityError) as error:
        keras_input(data, **params)
    assert message in str(error.value) and "\n" not in str(error.value)


def test_the_documented_example_trains_the_built_in_model_in_fit(capsys):
    """docs/testing.md's block, as it stands: the seed's GraphNetwork in ``model.fit`` on
    ``keras_input``'s batches, under the sentinel, for two epochs."""
    text = TESTING_DOC.read_text(encoding="utf-8")
    section = text[text.index(SECTION) :]
    section = section[: section.index("\n## ", 1)]
    (block,) = re.findall(r"```python\n(.*?)```", section, flags=re.S)
    namespace: dict = {}
    exec(compile(block, str(TESTING_DOC), "exec"), namespace)
    losses = namespace["history"].history["loss"]
    assert len(losses) == 2 and np.isfinite(losses).all(), losses
    assert losses[1] != losses[0], "the loss must move between epochs"
    assert np.isfinite(namespace["history"].history["val_loss"]).all()
    sentinel = namespace["sentinel"]
    assert sentinel.failure is None and sentinel.result["first_nan_epoch"] is None
    assert str(losses[0])[:6] in capsys.readouterr().out
