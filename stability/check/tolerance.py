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

Some models are ill-conditioned in their inputs whatever their arithmetic: a batch
normalization of raw features of mean 1000 and spread near zero divides each rounding of a
feature, and of its batch mean, by the spread. A float32 model is as accurate as float32
allows when what it predicts is what the float64 model predicts for inputs moved by float32
roundings: its backward error is a rounding (Higham, 1.5). A sum of ``n`` terms in float32
is the exact sum of its terms moved by about ``sqrt(n) * u`` each, ``u = eps / 2``, with high
probability (Higham and Mary, "A new approach to probabilistic rounding error analysis",
2019); a batch's longest sum has at most as many terms as it has nodes or edges.
``input_sensitivity`` moves the inputs by that much and measures how far the float64
predictions go; the bound adds it. Keras' own ``BatchNormalization`` on such features
stays within it, while ``E[x^2] - E[x]^2`` (keras#18795, the zoo's
``s_keras_fast_variance``) still exceeds it several-fold on the case's own data
(``tests/test_check_tolerance.py``).
"""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np

from stability.check.subject import Subject
from stability.core.tolerance import machine_eps
from stability.data.graphs import GraphBatch

#: Roundings of the inputs ``input_sensitivity`` tries; a few suffice to see the condition.
ROUNDINGS = 4

#: The seed of those roundings: the same input, the same bound.
ROUNDING_SEED = 0


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


def input_sensitivity(
    twin: Subject, batch: GraphBatch, dtype: str, training: bool, predictions: np.ndarray
) -> np.ndarray:
    """Per prediction: the largest change of the float64 ``twin``'s ``predictions`` of
    ``batch`` when each node feature and distance moves by ``sqrt(n) * eps(dtype) / 2`` of
    itself, up or down at random, ``n`` the batch's nodes or edges, whichever are more
    (``ROUNDINGS`` draws, seeded). A move to a non-finite prediction says nothing about the
    size of a rounding and is not counted."""
    rng = np.random.default_rng(ROUNDING_SEED)
    terms = max(batch.num_nodes, batch.num_edges, 1)
    move = math.sqrt(terms) * machine_eps(dtype) / 2
    largest = np.zeros_like(np.asarray(predictions, np.float64))
    for _ in range(ROUNDINGS):
        moved = replace(
            batch,
            nodes=batch.nodes * (1 + move * rng.choice((-1.0, 1.0), batch.nodes.shape)),
            edges=batch.edges * (1 + move * rng.choice((-1.0, 1.0), batch.edges.shape)),
        )
        with np.errstate(invalid="ignore"):
            change = np.abs(twin.predict(moved, training) - predictions)
        largest = np.fmax(largest, np.where(np.isfinite(change), change, 0.0))
    return largest
