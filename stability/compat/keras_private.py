"""Keras' private behaviour the harness relies on, in one place: each contract here is
checked by a test in ``tests/test_private_apis.py`` that exercises it, so a release that
changes one fails a named test instead of misnaming a failure.

- an optimizer names a weight's slot variable ``<weight path with "/" as "_">_<slot>``
  (Adam's ``dense_kernel_velocity``);
- ``Model.train_step`` calls ``compute_loss(x, y, y_pred, sample_weight, ...)`` with these
  four positionally (``COMPUTE_LOSS_ARGS``), which ``NanSentinel`` reads.

The walk over nested layers is the third (``stability.compat.keras_layers``).
"""

from __future__ import annotations

from typing import Any

#: The positional arguments ``Model.train_step`` passes ``compute_loss``, in order.
COMPUTE_LOSS_ARGS = ("x", "y", "y_pred", "sample_weight")


def _slot_prefix(weight: Any) -> str:
    return weight.path.replace("/", "_") + "_"


def is_slot_of(slot: Any, weight: Any) -> bool:
    """Whether optimizer variable ``slot`` is one of ``weight``'s slots (by Keras' naming)."""
    return slot.name.startswith(_slot_prefix(weight))


def slot_name(slot: Any, weight: Any) -> str:
    """The slot's own name (``velocity``, ``momentum``) of ``weight``'s slot variable."""
    return slot.name.removeprefix(_slot_prefix(weight))
