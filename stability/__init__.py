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
    "NanSentinel": "callback",
    "Case": "cases",
    "load_case": "cases",
    "CaseError": "errors",
    "DataError": "errors",
    "NameNotFound": "errors",
    "StabilityError": "errors",
    "Graph": "graphs",
    "GraphBatch": "graphs",
    "batch_graphs": "graphs",
    "RESULT_FIELDS": "results",
    "RunResult": "results",
    "Trainer": "trainer",
    "TrainConfig": "trainer",
    "BuildContext": "variants",
    "Recipe": "variants",
    "Variant": "variants",
    "create_recipe": "variants",
    "get_variant": "variants",
    "list_variants": "variants",
    "register_variant": "variants",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'stability' has no attribute {name!r}")
    return getattr(importlib.import_module(f"stability.{_EXPORTS[name]}"), name)


def __dir__() -> list[str]:
    return __all__
