"""The compiled training step is traced once per run, whatever the batch's shape."""

import numpy as np
import pytest

from stability.data.graphs import batch_graphs
from stability.model.variants import get_variant
from stability.train.config import TrainConfig
from stability.train.guard import StepReport
from stability.train.step import fed, input_signature, make_predict, make_train_step
from stability.train.trainer import Trainer


@pytest.mark.parametrize("variant", ["raw_e", "grad_clip"])
def test_batches_of_every_size_reuse_one_trace(variant, tiny_dataset):
    trainer = Trainer(get_variant(variant), tiny_dataset, TrainConfig(hidden=8))
    recipe = trainer.build()
    signature = input_signature(tiny_dataset.num_features, "float32")
    step = make_train_step(recipe, signature, guard=True)
    predict = make_predict(recipe.model, signature)
    graphs = tiny_dataset.train
    sizes = [1, 2, 3, 5, 8, 13, len(graphs)]  # node and edge counts differ in every batch
    shapes = set()
    for size in sizes:
        batch = batch_graphs(graphs[:size], targets=np.zeros(size))
        shapes.add((batch.num_nodes, batch.num_edges, batch.num_graphs))
        report = StepReport.of(step(batch.as_inputs(), batch.targets))
        assert report.ok, f"batch of {size} graphs went non-finite: {report.flags}"
        predictions, healthy = predict(batch.as_inputs())
        assert healthy.numpy() and np.isfinite(predictions.numpy()).all()
    assert len(shapes) == len(sizes), "the test needs batches of distinct shapes"
    assert step.experimental_get_tracing_count() == 1
    assert predict.experimental_get_tracing_count() == 1


def test_the_counter_sees_a_retrace(tiny_dataset):
    """Guards the test above: a step without the signature retraces on a new shape."""
    import tensorflow as tf

    trainer = Trainer(get_variant("raw_e"), tiny_dataset, TrainConfig(hidden=8))
    recipe = trainer.build()
    signature = input_signature(tiny_dataset.num_features, "float32")
    loose = tf.function(make_train_step(recipe, signature, guard=True).python_function)
    for size in (1, 2):
        batch = batch_graphs(tiny_dataset.train[:size], targets=np.zeros(size))
        loose(batch.as_inputs(), batch.targets)
    assert loose.experimental_get_tracing_count() == 2


def test_the_fed_step_computes_what_the_step_computes_bit_for_bit(tiny_dataset):
    """``fed`` calls the step's one concrete function with tensors of the signature's
    dtypes (the trainer's way): two models from the same weights, one stepped each way,
    report the same flags and statistics and end with the same weights; float64 targets
    and an int64 graph count are converted as ``tf.function`` converts them."""
    signature = input_signature(tiny_dataset.num_features, "float32")
    recipes = [
        Trainer(get_variant("raw_e"), tiny_dataset, TrainConfig(hidden=8)).build() for _ in range(2)
    ]
    recipes[1].model.set_weights(recipes[0].model.get_weights())
    plain = make_train_step(recipes[0], signature, guard=True)
    fed_step = fed(make_train_step(recipes[1], signature, guard=True), signature)
    fed_predict = fed(make_predict(recipes[1].model, signature), signature[:1])
    plain_predict = make_predict(recipes[0].model, signature)
    for size in (1, 3, 8, 3):
        batch = batch_graphs(tiny_dataset.train[:size], targets=np.linspace(-1.0, 1.0, size))
        inputs = {**batch.as_inputs(), "num_graphs": np.int64(batch.num_graphs)}
        targets = batch.targets.astype(np.float64)
        np.testing.assert_array_equal(
            fed_step(inputs, targets).numpy(), plain(inputs, targets).numpy()
        )
        for a, b in zip(fed_predict(inputs), plain_predict(inputs), strict=True):
            np.testing.assert_array_equal(a.numpy(), b.numpy())
    for a, b in zip(recipes[0].model.get_weights(), recipes[1].model.get_weights(), strict=True):
        np.testing.assert_array_equal(a, b)
