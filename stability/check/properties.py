"""What the check asks of a model, one property each: a predicate over a list of graphs that
returns a ``Violation`` (what broke, where) or None.

- ``step``: one training step through the step guard (forward, backward, the update), undone
  after it: every value finite, the attention normalized, the updated weights finite, or
  the first failure named as training names it;
- the invariants of a graph network (``INVARIANTS``), each with a tolerance from the dtype
  (``stability.check.tolerance``): ``node_permutation``, ``edge_order``,
  ``batch_independence``, ``edge_continuity``, ``dtype_agreement`` and
  ``attention_normalization``.

An invariant's predicate skips inputs the model raises on: they are the ``step`` property's
finding, so one input is not reported once per property.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

import numpy as np
import tensorflow as tf

from stability.check.subject import Subject
from stability.check.tolerance import (
    agreement_tolerance,
    compute_dtype,
    depth_factor,
    input_sensitivity,
)
from stability.core.invariants import INVARIANTS
from stability.data.graphs import Graph, GraphBatch

#: A step failure's kind (``core.failures.Kind``) in the report's words.
KIND_WORDS = {
    "nonfinite": "a non-finite value",
    "normalization": "attention weights not summing to 1",
    "masked_gradient": "a non-finite gradient the gradient transform masked",
}

#: Every property: the step, then the invariants.
PROPERTIES = ("step", *INVARIANTS)

#: What a model may raise on a strange graph (a shape or an index it did not expect).
MODEL_ERRORS = (tf.errors.InvalidArgumentError, ValueError, IndexError)

#: The seed of every permutation a property draws: the same input, the same verdict.
PERMUTATION_SEED = 0


@dataclass(frozen=True)
class Violation:
    """What broke: ``detail`` in words; ``stage``, ``layer``, ``op`` and ``cause`` where the
    step guard named a failure; ``deviation`` and ``tolerance`` for an invariant."""

    detail: str
    stage: str | None = None
    layer: str | None = None
    op: str | None = None
    cause: str | None = None
    deviation: float | None = None
    tolerance: float | None = None


Predicate = Callable[[Subject, Sequence[Graph]], "Violation | None"]


def step(subject: Subject, graphs: Sequence[Graph]) -> Violation | None:
    """One training step, undone after it: the guard's first failure, named; or the error the
    model raised."""
    try:
        failure = subject.failure(graphs)
    except Exception as exc:  # the user's model on a graph it did not expect: a finding
        return Violation(
            f"the step raises {type(exc).__name__}: {error_line(exc)}", stage="forward"
        )
    if failure is None:
        return None
    return Violation(
        f"{KIND_WORDS.get(failure.kind.value, failure.kind.value)} in the "
        f"{failure.stage.value} stage",
        stage=failure.stage.value,
        layer=failure.layer,
        op=failure.op,
        cause=failure.cause.value,
    )


def step_fails(subject: Subject, graphs: Sequence[Graph]) -> Violation | None:
    """``step`` without naming the failure (naming replays the step op by op): what a search
    asks of every input it tries; ``step`` then names the failure of the one it keeps."""
    try:
        failed = subject.fails(graphs)
    except Exception as exc:  # as in ``step``
        return Violation(f"the step raises {type(exc).__name__}: {error_line(exc)}")
    return Violation("the step fails") if failed else None


#: Each property's cheaper predicate for a search, where it has one.
SEARCH = {"step": step_fails}


def error_line(exc: BaseException, limit: int = 200) -> str:
    """The line of an error that says what went wrong: TensorFlow's graph errors open with
    "Graph execution error:" and a node's traceback, and end with the message."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    meaningful = [
        line
        for line in lines
        if not line.startswith(("Graph execution error", "Detected at node", "File ", "["))
    ]
    text = meaningful[-1] if meaningful else (lines[-1] if lines else "")
    return text[:limit]


def node_permutation(subject: Subject, graphs: Sequence[Graph]) -> Violation | None:
    """Each graph's nodes renumbered: its prediction must not change."""
    rng = np.random.default_rng(PERMUTATION_SEED)
    return _agree(subject, graphs, [permute_nodes(g, rng) for g in graphs], "nodes renumbered")


def edge_order(subject: Subject, graphs: Sequence[Graph]) -> Violation | None:
    """Each graph's edge list reordered: its prediction must not change."""
    rng = np.random.default_rng(PERMUTATION_SEED)
    return _agree(subject, graphs, [permute_edges(g, rng) for g in graphs], "edges reordered")


def batch_independence(subject: Subject, graphs: Sequence[Graph]) -> Violation | None:
    """A graph's prediction alone, in the batch, in the batch reversed and in the batch padded
    as the trainer pads it under XLA must agree."""
    if len(graphs) < 2:
        return None
    try:
        together = subject.predict(subject.batch(graphs))
        reverse = subject.predict(subject.batch(graphs[::-1]))[::-1]
        alone = np.concatenate([subject.predict(subject.batch([g])) for g in graphs])
    except MODEL_ERRORS:
        return None
    others = [(alone, "alone"), (reverse, "in the batch reversed")]
    # A model that takes no masks (docs/plugins.md) raises here: padding is not its input.
    with contextlib.suppress(Exception):
        others.append((subject.predict_padded(subject.batch(graphs)), "in the batch padded"))
    tolerance = agreement_tolerance(compute_dtype(subject), together, alone)
    for other, how in others:
        found = _worst(together, other, tolerance)
        if found is not None:
            index, deviation, allowed = found
            return Violation(
                f"graph {index} of {len(graphs)} predicts {together.ravel()[index]:.6g} in "
                f"the batch and {other.ravel()[index]:.6g} {how}",
                deviation=deviation,
                tolerance=allowed,
            )
    return None


def dtype_agreement(subject: Subject, graphs: Sequence[Graph]) -> Violation | None:
    """The same weights in float64 must predict what the model predicts, within a bound that
    grows with the model's depth (``tolerance.depth_factor``): as it predicts, and as the
    training step computes (batch statistics), where two such passes agree (no dropout)."""
    twin = subject.float64_twin()
    if twin is None:
        return None
    batch = subject.batch(graphs)
    wide = widened(batch)
    dtype, depth = compute_dtype(subject), depth_factor(subject)
    for training in (False, True):
        try:
            low = subject.predict(batch, training)
            high = twin.predict(wide, training)
            if training and subject.stochastic(graphs):
                return None  # a random layer (dropout): two passes differ anyway
        except MODEL_ERRORS:
            return None
        if not np.all(np.isfinite(low)):
            return None  # a non-finite prediction is the step property's finding
        bound = agreement_tolerance(dtype, low, high)
        found = _worst(high, low, depth * bound)
        if found is not None:  # only then is the inputs' rounding worth its 4 predictions
            sensitivity = input_sensitivity(twin, wide, dtype, training, high)
            found = _worst(high, low, depth * (bound + sensitivity))
        if found is not None:
            index, deviation, allowed = found
            mode = " as the training step computes it" if training else ""
            return Violation(
                f"prediction {index}{mode} is {low.ravel()[index]:.6g} in "
                f"{dtype} and {high.ravel()[index]:.6g} in float64 with the "
                "same weights",
                deviation=deviation,
                tolerance=allowed,
            )
    return None


def widened(batch: GraphBatch) -> GraphBatch:
    """``batch`` in float64 holding the very values the model was given: its features and
    distances rounded to the model's dtype, then widened, which is exact. The float64 twin
    then differs from the model in its arithmetic only, not in digits of the data that the
    model's dtype cannot hold (a height of 1000.3 A is 1000.29999 in float32, and a
    normalization of two such atoms amplifies that rounding of the input, in any model)."""
    return replace(
        batch,
        nodes=batch.nodes.astype(np.float64),
        edges=batch.edges.astype(np.float64),
        targets=batch.targets.astype(np.float64),
    )


def attention_normalization(subject: Subject, graphs: Sequence[Graph]) -> Violation | None:
    """The attention the model exposes sums to 1 per node, within the guard's tolerance."""
    try:
        ok = subject.attention_ok(subject.batch(graphs))
    except MODEL_ERRORS:
        return None
    return None if ok else Violation("a node's attention weights do not sum to 1")


def _agree(
    subject: Subject, graphs: Sequence[Graph], changed: Sequence[Graph], how: str
) -> Violation | None:
    try:
        before = subject.predict(subject.batch(graphs))
        after = subject.predict(subject.batch(changed))
    except MODEL_ERRORS:
        return None
    tolerance = agreement_tolerance(compute_dtype(subject), before, after)
    found = _worst(before, after, tolerance)
    if found is None:
        return None
    index, deviation, allowed = found
    return Violation(
        f"prediction {index} moves from {before.ravel()[index]:.6g} to "
        f"{after.ravel()[index]:.6g} with the {how}",
        deviation=deviation,
        tolerance=allowed,
    )


def _worst(
    expected: np.ndarray, got: np.ndarray, tolerance: np.ndarray
) -> tuple[int, float, float] | None:
    """The prediction furthest beyond its tolerance: (index, |difference|, tolerance), or
    None when every one is within. Only predictions finite on both sides are compared: a
    NaN or an Inf is the ``step`` property's finding, not an invariant's."""
    tolerance = np.broadcast_to(tolerance, np.shape(expected)).ravel()
    expected, got = np.ravel(expected), np.ravel(got)
    finite = np.isfinite(expected) & np.isfinite(got) & np.isfinite(tolerance)
    excess = np.where(finite, np.abs(np.where(finite, expected - got, 0.0)) - tolerance, -np.inf)
    if not excess.size or np.max(excess) <= 0:
        return None
    index = int(np.argmax(excess))
    return index, float(abs(expected[index] - got[index])), float(tolerance[index])


def permute_nodes(graph: Graph, rng: np.random.Generator) -> Graph:
    """``graph`` with its nodes renumbered by a random permutation (edges follow them)."""
    order = rng.permutation(graph.num_nodes)  # new position k holds old node order[k]
    new_index = np.empty_like(order)
    new_index[order] = np.arange(graph.num_nodes)
    return replace(
        graph,
        nodes=graph.nodes[order],
        senders=new_index[graph.senders].astype(graph.senders.dtype),
        receivers=new_index[graph.receivers].astype(graph.receivers.dtype),
    )


def permute_edges(graph: Graph, rng: np.random.Generator) -> Graph:
    """``graph`` with its edge list in a random order."""
    order = rng.permutation(graph.num_edges)
    return replace(
        graph,
        edges=graph.edges[order],
        senders=graph.senders[order],
        receivers=graph.receivers[order],
    )
