"""A segment softmax bridged to NumPy (``Implementation``), from TensorFlow or NumPy.

``as_implementation(fn)`` probes ``fn`` on a small input and wraps it: a TensorFlow ``fn``
gets gradients by ``tf.GradientTape``, a NumPy one has none; JAX and others come in as an
``Implementation`` (``stability.testing.adapters``). ``check_output`` holds every output
to the logits' shape (``[num_edges]``, or ``[num_edges, heads]``) and dtype.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from stability.core.errors import StabilityError
from stability.testing.inputs import SoftmaxInput
from stability.testing.paragraph import describe_input, error_text


class ConformanceError(StabilityError):
    """A softmax that cannot be checked: it raises on a plain input, or returns the wrong
    shape or dtype."""


@dataclass(frozen=True)
class Implementation:
    """A segment softmax bridged to NumPy: ``forward(x)`` returns ``[num_edges]`` in
    ``x``'s dtype; ``gradient(x)`` returns d sum(softmax * x.messages) / d logits, or the
    implementation has none (``None``)."""

    name: str
    forward: Callable[[SoftmaxInput], Any]
    gradient: Callable[[SoftmaxInput], Any] | None = None
    takes_mask: bool = False


def _arguments(x: SoftmaxInput, convert: Callable[[np.ndarray], Any]) -> list[Any]:
    args = [convert(x.logits), convert(x.segment_ids), x.num_segments]
    return args if x.mask is None else [*args, convert(x.mask)]


def from_tensorflow(
    fn: Callable[..., Any], *, name: str | None = None, mask: bool = False
) -> Implementation:
    """An ``Implementation`` of a TensorFlow ``fn``, with gradients by ``tf.GradientTape``."""
    import tensorflow as tf

    def forward(x: SoftmaxInput) -> Any:
        return fn(*_arguments(x, tf.constant))

    def gradient(x: SoftmaxInput) -> Any:
        logits = tf.constant(x.logits)
        with tf.GradientTape() as tape:
            tape.watch(logits)
            args = _arguments(x, tf.constant)
            out = fn(logits, *args[1:])
            check_output(x, out, "output")
            objective = tf.reduce_sum(out * tf.constant(x.messages))
        return tape.gradient(objective, logits)

    return Implementation(_name_of(fn, name), forward, gradient, mask)


def from_numpy(
    fn: Callable[..., Any], *, name: str | None = None, mask: bool = False
) -> Implementation:
    """An ``Implementation`` of a NumPy ``fn``; it has no gradients."""
    return Implementation(_name_of(fn, name), lambda x: fn(*_arguments(x, np.asarray)), None, mask)


def _name_of(fn: Any, name: str | None) -> str:
    return name or getattr(fn, "__name__", None) or type(fn).__name__


def probe(dtype: str, mask: bool) -> SoftmaxInput:
    """A small input every segment softmax must handle: two edges into segment 0, two into
    2, segment 1 empty. Four edges in three segments: an output of one value per segment
    has another shape than the logits, so ``check_output`` tells it from one per edge."""
    kind = np.dtype(dtype).type
    return SoftmaxInput(
        logits=np.array([0.5, -0.25, 1.0, 0.0], kind),
        segment_ids=np.array([0, 0, 2, 2], np.int32),
        num_segments=3,
        mask=np.array([True, True, True, True]) if mask else None,
        messages=np.array([1.0, -0.5, 0.25, -1.0], kind),
    )


def as_implementation(
    fn: Callable[..., Any] | Implementation, *, name: str | None = None, mask: bool = False
) -> Implementation:
    """``fn`` itself if it is an ``Implementation``; else a TensorFlow one if ``fn`` returns
    a ``tf.Tensor`` on TensorFlow inputs, a NumPy one if it returns an array on NumPy
    inputs. ``ConformanceError`` when it does neither."""
    if isinstance(fn, Implementation):
        return fn
    if not callable(fn):
        raise ConformanceError(f"{fn!r} is not callable: pass fn(logits, segment_ids, n)")
    import tensorflow as tf

    plain = probe("float32", mask)
    try:
        if isinstance(fn(*_arguments(plain, tf.constant)), tf.Tensor):
            return from_tensorflow(fn, name=name, mask=mask)
    except Exception:  # not a TensorFlow function: try it on NumPy arrays next
        pass
    try:
        out = fn(*_arguments(plain, np.asarray))
    except Exception as exc:
        raise ConformanceError(
            f"{_name_of(fn, name)} raised {error_text(exc)} on a plain input "
            f"({describe_input(plain)})"
        ) from None
    if not isinstance(out, np.ndarray | np.generic):
        raise ConformanceError(
            f"{_name_of(fn, name)} returned {type(out).__name__}, neither a tf.Tensor nor a "
            "numpy array; wrap other frameworks in an Implementation "
            "(stability.testing.adapters)"
        )
    return from_numpy(fn, name=name, mask=mask)


def check_output(x: SoftmaxInput, out: Any, what: str) -> np.ndarray:
    """``out`` as a NumPy array; ``ConformanceError`` if its shape or dtype is not ``x``'s."""
    array = np.asarray(out.numpy() if hasattr(out, "numpy") else out)
    if array.shape != x.logits.shape:
        per_segment = array.shape[:1] == (x.num_segments,) and x.num_segments != len(x.logits)
        raise ConformanceError(
            f"returned {what} of shape {list(array.shape)} for logits of shape "
            f"{list(x.logits.shape)} ({len(x.logits)} edges in {x.num_segments} segments)"
            f"{', one value per segment' if per_segment else ''}; it must be the logits' "
            "shape, one value per edge: [num_edges], or [num_edges, heads] for logits of "
            "that shape"
        )
    if array.dtype != x.logits.dtype:
        raise ConformanceError(
            f"returned {what} of dtype {array.dtype} for {x.dtype} logits; it must keep the "
            "logits' dtype"
        )
    return array
