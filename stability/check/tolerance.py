"""How far two predictions that should be equal may differ: tolerances from the dtype.

Renumbering nodes, reordering edges or batching graphs differently changes only the order
in which a correct model sums its messages. A sum of ``n`` terms reordered moves by at most
about ``n * eps`` times the sum of the terms' sizes (Higham, "Accuracy and Stability of
Numerical Algorithms", 4.2), and every later layer can amplify that by its condition. Neither
is known for a user's model, so the bound keeps half the significand: ``sqrt(eps)`` times the
predictions' size (at least 1, the size of a standardized target). That is 3.5e-4 relative
in float32 and 0.031 in float16: 1,000 and 30 times a float32 and a float16 rounding, while
a bug that misaligns neighbours or mixes graphs moves a prediction by a good part of itself.

float32 against float64 with the same weights (``dtype_agreement``) is allowed that bound
times ``depth_factor``, one more for every message-passing layer: each layer's sums round
once more. A cancellation such as ``sqrt(E[x^2] - E[x]^2)`` loses every float32 digit of a
small variance at once, far beyond that.
"""

from __future__ import annotations

import math

import numpy as np

from stability.check.subject import Subject
from stability.core.tolerance import machine_eps


def compute_dtype(subject: Subject) -> str:
    """The dtype the model computes in (float16 under a mixed policy), else its storage's."""
    return str(getattr(subject.recipe.model, "compute_dtype", None) or subject.dtype)


def agreement_tolerance(dtype: str, *predictions: np.ndarray) -> np.ndarray:
    """Per prediction: ``sqrt(eps(dtype)) * max(1, |p| for p in predictions)``."""
    size = np.ones_like(np.asarray(predictions[0], np.float64))
    for p in predictions:
        with np.errstate(invalid="ignore"):
            size = np.fmax(size, np.abs(np.asarray(p, np.float64)))
    return math.sqrt(machine_eps(dtype)) * size


def depth_factor(subject: Subject) -> float:
    """``num_layers + 1``: the rounding steps a prediction passes through, roughly."""
    return float(subject.config.num_layers + 1)
