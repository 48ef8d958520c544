"""stability: a numerical-stability test harness for graph neural networks in TensorFlow/Keras.

Train a registry of model variants on graph data, find the first non-finite value of each
run and where it came from, and write comparison reports.

The public names load lazily (PEP 562), so ``python -m stability`` can start TensorFlow
quietly before anything imports it.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {  # public name -> module that defines it
    "NanSentinel": "train.sentinel",
    "Case": "sweep.cases",
    "load_case": "sweep.cases",
    "CaseError": "core.errors",
    "DataError": "core.errors",
    "NameNotFound": "core.errors",
    "StabilityError": "core.errors",
    "Dataset": "data",
    "list_datasets": "data",
    "load_dataset": "data",
    "register_dataset": "data",
    "Graph": "data.graphs",
    "GraphBatch": "data.graphs",
    "batch_graphs": "data.graphs",
    "save_graphs": "data.npz",
    "keras_input": "train.keras_input",
    "RESULT_FIELDS": "core.results",
    "RunResult": "core.results",
    "Trainer": "train.trainer",
    "TrainConfig": "train.trainer",
    "BuildContext": "model.recipe",
    "Recipe": "model.recipe",
    "Variant": "model.recipe",
    "create_recipe": "model.variants",
    "get_variant": "model.variants",
    "list_variants": "model.variants",
    "register_variant": "model.variants",
    "register_softmax": "model.softmax",
    "register_logit_transform": "model.logit_transforms",
    "ConformanceReport": "testing.conformance",
    "Implementation": "testing.implementation",
    "assert_segment_softmax_conforms": "testing.conformance",
    "check_segment_softmax": "testing.conformance",
    "pin_threads": "train.threads",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'stability' has no attribute {name!r}")
    return getattr(importlib.import_module(f"stability.{_EXPORTS[name]}"), name)


def __dir__() -> list[str]:
    return __all__
