"""The one paragraph a conformance failure reads as: the input, the offending segment,
what was expected and what came out.
"""

from __future__ import annotations

import numpy as np

from stability.testing.inputs import SoftmaxInput


def values_text(array: np.ndarray) -> str:
    """``[v0, v1, ...]``, each value as ``str`` prints it."""
    return "[" + ", ".join(str(v) for v in array) + "]"


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"


def error_text(exc: BaseException) -> str:
    """``Type: message`` on one line, the message cut at 300 characters."""
    text = " ".join(str(exc).split())
    return f"{type(exc).__name__}: {text[:300]}" if text else type(exc).__name__


def describe_input(x: SoftmaxInput) -> str:
    """``Input: 3 edges in 2 segments, float32 logits [...], segment_ids [...]``."""
    text = (
        f"Input: {_count(len(x.logits), 'edge')} in {_count(x.num_segments, 'segment')}, "
        f"{x.dtype} logits "
        f"{values_text(x.logits)}, segment_ids {values_text(x.segment_ids)}"
    )
    return text if x.mask is None else f"{text}, mask {values_text(x.mask)}"


def raised_text(exc: BaseException, x: SoftmaxInput) -> str:
    """The paragraph for an implementation that raised on ``x``."""
    return f"it raised {error_text(exc)}. {describe_input(x)}."


def first_bad(
    x: SoftmaxInput,
    bad: np.ndarray,
    what: str,
    actual: np.ndarray,
    expected: np.ndarray,
    gradient: bool = False,
) -> str | None:
    """None if no edge is ``bad`` ``[num_edges]``, else the paragraph about the first bad
    edge's segment: its logits (mask, messages), the expected and the actual values."""
    if not bad.any():
        return None
    edge = int(np.argmax(bad))
    segment = int(x.segment_ids[edge])
    members = np.flatnonzero(x.segment_ids == segment)
    kind = "gradient" if gradient else "softmax"
    text = (
        f"{what} at edge {edge}. {describe_input(x)}. Segment {segment} (edges "
        f"{values_text(members)}) has logits {values_text(x.logits[members])}"
    )
    if x.mask is not None:
        text += f", mask {values_text(x.mask[members])}"
    if gradient:
        text += f", messages {values_text(x.messages[members])}"
    return (
        f"{text}; expected {kind} {values_text(expected[members])}, "
        f"actual {values_text(actual[members])}."
    )
