"""A harness ``Dataset`` as the input of your own ``keras.Model.fit``: a ``tf.data.Dataset``
of (inputs, targets), one batch of graphs per element.

``GraphBatch.as_inputs()`` gives ``num_graphs`` as a 0-d array, which ``fit`` refuses from
a Python generator ("the arrays must be at least rank 1"); from a ``tf.data.Dataset`` whose
signature says ``[]`` it takes it, so the model gets the very inputs the harness's trainer
feeds it, and the built-in ``GraphNetwork`` needs no change.
"""

from __future__ import annotations

import math
from collections.abc import Iterator

import numpy as np
import tensorflow as tf

from stability.core.errors import StabilityError
from stability.data.graphs import Graph, batch_graphs
from stability.data.registry import Dataset
from stability.train.config import DTYPES, storage_dtype
from stability.train.step import input_signature

#: The splits of a ``Dataset`` that ``keras_input`` reads.
SPLITS = ("train", "val")


def keras_input(
    data: Dataset,
    split: str = "train",
    *,
    batch_size: int = 32,
    seed: int = 0,
    dtype: str = "float32",
) -> tf.data.Dataset:
    """The ``split`` graphs of ``data`` as (inputs, targets) batches for ``model.fit``.

    Each element is one ``batch_graphs`` batch of ``batch_size`` graphs (the last one may be
    smaller). Inputs are the dict of ``GraphBatch.as_inputs()``: ``nodes``
    ``[num_nodes, num_features]``, ``edges`` ``[num_edges, 1]``, ``senders`` and
    ``receivers`` ``[num_edges]``, ``node_graph`` ``[num_nodes]`` and ``num_graphs`` ``[]``;
    targets are ``[num_graphs]``, standardized with the training set's ``target_mean`` and
    ``target_std`` as the trainer trains on them (a prediction's mean times ``target_std``
    plus ``target_mean`` is in the target's own units). Every size that varies is ``None``
    in the signature, so a compiled step is traced once.

    ``train`` is shuffled afresh on every pass (every epoch), by a generator seeded with
    ``seed``: the same seed gives the batches the trainer draws with that seed. ``val`` is
    read in order. ``dtype`` is a harness dtype (``float32``, ``float64`` or
    ``mixed_float16``, whose inputs are float32).
    """
    graphs = _split(data, split)
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise StabilityError(f"keras_input: batch_size={batch_size!r} must be an integer > 0")
    if dtype not in DTYPES:
        raise StabilityError(f"keras_input: dtype={dtype!r} must be one of {', '.join(DTYPES)}")
    stored = storage_dtype(dtype)
    targets = (np.array([g.target for g in graphs]) - data.target_mean) / data.target_std
    rng = np.random.default_rng(seed) if split == "train" else None

    def batches() -> Iterator[tuple[dict[str, np.ndarray], np.ndarray]]:
        order = rng.permutation(len(graphs)) if rng is not None else np.arange(len(graphs))
        for start in range(0, len(order), batch_size):
            chosen = order[start : start + batch_size]
            batch = batch_graphs([graphs[i] for i in chosen], targets[chosen], dtype=stored)
            yield batch.as_inputs(), batch.targets

    signature = input_signature(data.num_features, stored)
    dataset = tf.data.Dataset.from_generator(batches, output_signature=signature)
    # A known length, so fit counts its steps per epoch instead of running out of data.
    steps = math.ceil(len(graphs) / batch_size)
    return dataset.apply(tf.data.experimental.assert_cardinality(steps))


def _split(data: Dataset, split: str) -> list[Graph]:
    if split not in SPLITS:
        raise StabilityError(f"keras_input: split={split!r} must be one of {', '.join(SPLITS)}")
    return data.train if split == "train" else data.val
