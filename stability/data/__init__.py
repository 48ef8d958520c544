"""The data layer: graphs, the data set registry, the built-in data sets and Hypothesis strategies.

Importing this package registers the built-in data sets (``synthetic``, ``generated``,
``g2``, ``structures``, ``npz``): each lives in its own module and registers itself with
``registry``, which imports none of them.
"""

from stability.data import (  # noqa: F401  (registration)
    generated,
    molecules,
    npz,
    structures,
    synthetic,
)
from stability.data.registry import (
    Dataset,
    dataset_from_key,
    dataset_key,
    dataset_parameters,
    list_datasets,
    load_dataset,
    register_dataset,
)

__all__ = [
    "Dataset",
    "dataset_from_key",
    "dataset_key",
    "dataset_parameters",
    "list_datasets",
    "load_dataset",
    "register_dataset",
]
