"""Assertions for a user's tests, whose messages show the values (as ``numpy.testing``).

``assert_finite(values)`` and ``assert_normalized(alpha, receivers)`` raise
``AssertionError`` naming the first offending entry or segment and its values;
``nonfinite`` and ``unnormalized`` are the checks behind them, which the conformance
suite uses to find a failing edge. Each takes NumPy arrays or anything ``np.asarray``
reads (a ``tf.Tensor`` in eager mode included). ``assert_runs_finite(results)`` does the
same for trained runs (``RunResult``s, as the ``stability_run`` fixture returns them):
it names each failing run's epoch, step, stage, layer, op and cause.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import numpy as np

from stability.core.failures import Kind
from stability.testing.tolerance import DEFAULT_ULPS, sum_tolerance

#: How many values a message shows before it elides the rest.
_SHOWN = 8


def _array(values: Any) -> np.ndarray:
    return np.asarray(values.numpy() if hasattr(values, "numpy") else values)


def _shown(values: np.ndarray) -> str:
    items = [str(v) for v in values[:_SHOWN]]
    more = len(values) - _SHOWN
    return "[" + ", ".join(items + ([f"... ({more} more)"] if more > 0 else [])) + "]"


def nonfinite(values: Any) -> np.ndarray:
    """``bool``, ``values``' shape: True where an entry is NaN or infinite."""
    return ~np.isfinite(_array(values))


def assert_finite(values: Any, what: str = "values") -> None:
    """``AssertionError`` unless every entry of ``values`` (any shape) is finite; the
    message counts the non-finite entries and shows the first ones with their indices."""
    array = _array(values)
    bad = nonfinite(array)
    if not bad.any():
        return
    where = np.argwhere(bad)
    first = ", ".join(f"{tuple(int(i) for i in w)}: {array[tuple(w)]!s}" for w in where[:_SHOWN])
    raise AssertionError(
        f"{what}: {int(bad.sum())} of {array.size} entries are not finite, first at {first}; "
        f"{what} {_shown(array.ravel())}"
    )


def segment_sums(
    alpha: Any, receivers: Any, num_segments: int, taking_part: Any = None
) -> tuple[np.ndarray, np.ndarray]:
    """The sum ``[num_segments]`` (float64) of ``alpha`` ``[num_edges]`` over each
    receiver's edges, and how many edges ``[num_segments]`` took part in it; edges where
    ``taking_part`` ``[num_edges]`` is False (masked) are left out of both."""
    alpha, receivers = _array(alpha), _array(receivers)
    part = np.ones(len(receivers), bool) if taking_part is None else _array(taking_part)
    sums = np.zeros(num_segments)
    np.add.at(sums, receivers[part], alpha[part].astype(np.float64))
    return sums, np.bincount(receivers[part], minlength=num_segments)


def unnormalized(
    alpha: Any,
    receivers: Any,
    num_segments: int,
    *,
    ulps: int = DEFAULT_ULPS,
    taking_part: Any = None,
) -> np.ndarray:
    """``bool`` ``[num_segments]``: True for a segment with an edge taking part whose
    ``alpha`` does not sum to 1 within ``(ulps + 2n) eps`` (``stability.testing.tolerance``);
    a segment without such an edge sums to nothing and is never flagged."""
    sums, counts = segment_sums(alpha, receivers, num_segments, taking_part)
    dtype = _array(alpha).dtype
    return ~(np.abs(sums - 1) <= sum_tolerance(dtype, counts, ulps)) & (counts > 0)


def assert_normalized(
    alpha: Any,
    receivers: Any,
    num_nodes: int | None = None,
    *,
    ulps: int = DEFAULT_ULPS,
    mask: Any = None,
) -> None:
    """``AssertionError`` unless the attention ``alpha`` ``[num_edges]`` (or
    ``[num_edges, heads]``, each head on its own) sums to 1 over the edges into each node
    that has one, within ``(ulps + 2n) eps`` for ``n`` incoming edges. ``receivers``
    ``[num_edges]`` is each edge's target node; ``num_nodes`` defaults to the largest
    receiver + 1; ``mask`` ``[num_edges]`` (True takes part) leaves masked edges out. The
    message names the first node off 1, its sum, its edges and their weights."""
    alpha, receivers = _array(alpha), _array(receivers).astype(np.int64)
    heads = alpha.reshape(len(alpha), -1) if alpha.ndim == 2 else alpha
    if alpha.ndim not in (1, 2) or len(alpha) != len(receivers) or receivers.ndim != 1:
        raise AssertionError(
            f"alpha of shape {list(alpha.shape)} for receivers of shape "
            f"{list(receivers.shape)}: it must be [num_edges] or [num_edges, heads]"
        )
    if num_nodes is None:
        num_nodes = int(receivers.max()) + 1 if receivers.size else 0
    columns = [heads] if heads.ndim == 1 else [heads[:, h] for h in range(heads.shape[1])]
    for head, weights in enumerate(columns):
        where = "" if len(columns) == 1 else f" (head {head})"
        _assert_head_normalized(weights, receivers, num_nodes, ulps, mask, where)


def _assert_head_normalized(
    alpha: np.ndarray, receivers: np.ndarray, num_nodes: int, ulps: int, mask: Any, where: str
) -> None:
    off = unnormalized(alpha, receivers, num_nodes, ulps=ulps, taking_part=mask)
    if not off.any():
        return
    sums, counts = segment_sums(alpha, receivers, num_nodes, mask)
    node = int(np.argmax(off))
    edges = np.flatnonzero(receivers == node)
    raise AssertionError(
        f"attention{where} does not sum to 1 at {int(off.sum())} of "
        f"{int((counts > 0).sum())} receiving nodes: node {node} sums to "
        f"{float(sums[node])!r} (tolerance "
        f"{float(sum_tolerance(alpha.dtype, counts[node], ulps))!r} for {int(counts[node])} "
        f"edges), edges {_shown(edges)} with alpha {_shown(alpha[edges])}"
    )


def assert_runs_finite(results: Any | Iterable[Any]) -> None:
    """``AssertionError`` unless every run (a ``RunResult`` or several) trained without a
    failure; the message counts the failed runs and gives, for each (the first
    ``_SHOWN``), the run, its first failure's epoch and step, stage (``first_nan_where``),
    layer, op and cause (``failure_cause``). No runs at all is a failure too: a test that
    trained nothing checked nothing."""
    runs = [results] if hasattr(results, "first_nan_epoch") else list(results)
    if not runs:
        raise AssertionError("no runs to check: the case trained nothing")
    failed = [run for run in runs if run.first_nan_epoch is not None]
    if not failed:
        return
    lines = [f"{len(failed)} of {len(runs)} runs failed:"]
    lines += [f"  {_describe_failure(run)}" for run in failed[:_SHOWN]]
    if len(failed) > _SHOWN:
        lines.append(f"  ... ({len(failed) - _SHOWN} more)")
    raise AssertionError("\n".join(lines))


def _describe_failure(run: Any) -> str:
    """One line: the run, then where and why it first failed (its result's columns)."""
    label = f"{run.variant} seed={run.seed} bs={run.batch_size} lr={run.learning_rate:g}"
    parts = [
        f"epoch {run.first_nan_epoch}",
        f"step {_or_dash(run.first_nan_step)}",
        f"stage {_or_dash(run.first_nan_where)}",
        f"layer {_or_dash(run.first_nan_layer)}",
        f"op {_or_dash(run.first_nan_op)}",
        f"cause {_or_dash(run.failure_cause)}",
    ]
    if run.failure_kind not in (None, Kind.NONFINITE):
        parts.append(f"kind {run.failure_kind}")
    return f"{label}: " + ", ".join(parts)


def _or_dash(value: Any) -> str:
    return "-" if value is None or value == "" else str(value)
