"""A data set with its edge distances transformed before any model sees them: the doctor's
data remedies, and the case key ``edge_transform``.

- ``standardized``: ``(e - mean) / std`` with the training set's mean and std, so that the
  attention logits a model makes of ``e`` start near the scale of its other inputs;
- ``squashed``: ``sigmoid(e)``, every distance inside (0, 1) (the seed's first fix, done to
  the data instead of inside the model).

The graphs, targets and split stay as they are; the key says what was done, so runs on the
transformed data are never mistaken for runs on the original.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from stability.data.graphs import Graph
from stability.data.registry import Dataset

#: The values of the case key ``edge_transform``.
EDGE_TRANSFORMS = ("none", "standardized", "squashed")


def transform_edges(dataset: Dataset, how: str) -> Dataset:
    """``dataset`` with every edge distance transformed by ``how`` (``EDGE_TRANSFORMS``)."""
    if how == "none":
        return dataset
    if how not in EDGE_TRANSFORMS:
        raise ValueError(f"edge transform {how!r} must be one of {', '.join(EDGE_TRANSFORMS)}")
    mean, std = dataset.edge_mean, dataset.edge_std  # the training set's (std 1 if constant)

    def changed(graph: Graph) -> Graph:
        edges = graph.edges.astype(np.float64)
        with np.errstate(over="ignore"):  # sigmoid of a huge negative e is 0, as it should be
            new = (edges - mean) / std if how == "standardized" else 1.0 / (1.0 + np.exp(-edges))
        return replace(graph, edges=new.astype(graph.edges.dtype))

    return Dataset(
        key=f"{dataset.key} | edges {how}",
        train=[changed(g) for g in dataset.train],
        val=[changed(g) for g in dataset.val],
        cutoff=dataset.cutoff,
        signed_edges=True,
    )
