"""Hypothesis strategies for a segment softmax's inputs, and the float64-or-better reference.

A drawn ``SoftmaxInput`` is what training eventually feeds an attention softmax:

- logits up to and past where ``exp`` leaves the dtype's range
  (``stability.core.limits``): a segment shifted past the overflow line, a whole segment
  sunk below the underflow line, and the dtype's largest finite values;
- empty segments (a node with no incoming edge), single-edge segments, ties (the same logit
  twice in a segment) and duplicate edges (an edge repeated, logit and segment alike);
- optionally a mask, whose masked entries draw the same extreme logits, since a masked
  logit that overflows can still poison its segment (``inf * 0 = NaN``).

Shapes: ``logits`` ``[num_edges]``, ``segment_ids`` ``[num_edges]`` (int32, in
``[0, num_segments)``), ``mask`` ``[num_edges]`` (bool, True takes part), ``messages``
``[num_edges]`` (the cotangent a gradient is taken against, in ``[-1, 1]``).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from hypothesis import strategies as st
from hypothesis.errors import InvalidArgument
from hypothesis.extra.numpy import arrays

from stability.core.limits import FLOAT_DTYPES, exp_limits

#: The float dtypes a softmax is checked in, by name.
DTYPES = FLOAT_DTYPES
_WIDTH = {"float16": 16, "float32": 32, "float64": 64}


@dataclass(frozen=True)
class SoftmaxInput:
    """One drawn input: the logits of ``num_edges`` edges in ``num_segments`` segments."""

    logits: np.ndarray  # [num_edges], in the checked dtype
    segment_ids: np.ndarray  # [num_edges], int32
    num_segments: int
    mask: np.ndarray | None  # [num_edges], bool; None when the softmax takes no mask
    messages: np.ndarray  # [num_edges], in the checked dtype, in [-1, 1]

    @property
    def dtype(self) -> str:
        return self.logits.dtype.name

    def taking_part(self) -> np.ndarray:
        """[num_edges] bool: the edges the softmax normalizes over (all, without a mask)."""
        return np.ones(self.logits.shape, bool) if self.mask is None else self.mask


def _check_dtype(dtype: str) -> None:
    if dtype not in DTYPES:
        raise InvalidArgument(f"dtype={dtype!r} must be one of {', '.join(DTYPES)}")


def special_logits(dtype: str) -> list[float]:
    """The representable logits on either side of the dtype's ``exp`` lines, plus 0 and the
    largest finite magnitudes: where a naive softmax changes from finite to not."""
    _check_dtype(dtype)
    kind = np.dtype(dtype).type
    limits = exp_limits(dtype)
    values = [0.0, float(np.finfo(kind).max), float(-np.finfo(kind).max)]
    for line in (limits.overflow, -limits.underflow):
        near = kind(line)
        values += [float(near), float(np.nextafter(near, kind(np.inf)))]
        values += [float(np.nextafter(near, kind(-np.inf)))]
    return sorted(set(values))


def logit_bound(dtype: str) -> float:
    """Twice the farther ``exp`` line, as a representable value: drawn logits reach past it."""
    limits = exp_limits(dtype)
    return float(np.dtype(dtype).type(2 * max(limits.overflow, limits.underflow)))


@st.composite
def softmax_inputs(
    draw: st.DrawFn,
    dtype: str = "float32",
    *,
    mask: bool = False,
    max_segments: int = 6,
    max_edges: int = 16,
) -> SoftmaxInput:
    """A ``SoftmaxInput`` in ``dtype`` with at most ``max_segments`` segments and
    ``max_edges`` edges before duplication (at most twice that after)."""
    _check_dtype(dtype)
    if max_segments < 1 or max_edges < 0:
        raise InvalidArgument(
            f"max_segments={max_segments!r} must be >= 1 and max_edges={max_edges!r} >= 0"
        )
    kind = np.dtype(dtype).type
    bound = logit_bound(dtype)
    num_segments = draw(st.integers(1, max_segments))
    num_edges = draw(st.integers(0, max_edges))
    segment_ids = draw(arrays(np.int32, num_edges, elements=st.integers(0, num_segments - 1)))
    elements = st.one_of(
        st.floats(-bound, bound, width=_WIDTH[dtype]),
        st.sampled_from(special_logits(dtype)),
    )
    logits = draw(arrays(np.float64, num_edges, elements=elements))
    # A whole segment shifted past a line: one logit past it is not enough for every bug
    # (an all-underflowed segment needs every logit below the underflow line). 0 shrinks first.
    limits = exp_limits(dtype)
    shifts = st.sampled_from([0.0, -2 * limits.underflow, 2 * limits.overflow])
    offsets = np.array(draw(st.lists(shifts, min_size=num_segments, max_size=num_segments)))
    logits = logits + offsets[segment_ids]
    # Duplicate edges: the same (logit, segment) again, as a multigraph has.
    repeats = draw(st.lists(st.integers(0, max(num_edges - 1, 0)), max_size=num_edges))
    if num_edges:
        segment_ids = np.concatenate([segment_ids, segment_ids[repeats]]).astype(np.int32)
        logits = np.concatenate([logits, logits[repeats]])
    finite = float(np.finfo(kind).max)
    # Inputs stay finite: the shift may carry a logit past the dtype's max, which is a
    # different question (an inf logit) than the ones checked here.
    logits = np.clip(logits, -finite, finite).astype(kind)
    edges = len(logits)
    taking_part = draw(arrays(np.bool_, edges)) if mask else None
    messages = draw(arrays(kind, edges, elements=st.floats(-1, 1, width=_WIDTH[dtype])))
    return SoftmaxInput(logits, segment_ids, num_segments, taking_part, messages)


def reference_softmax(x: SoftmaxInput) -> np.ndarray:
    """[num_edges] float64: the segment softmax of ``x`` computed in ``np.longdouble``
    (80-bit on x86-64, else float64) with the segment max subtracted; masked edges and
    segments with no edge taking part get 0."""
    logits = x.logits.astype(np.longdouble)
    part = x.taking_part()
    out = np.zeros(logits.shape, np.longdouble)
    for segment in np.unique(x.segment_ids[part]):
        members = (x.segment_ids == segment) & part
        # The max subtracted: every exp argument <= 0, so nothing overflows, and the
        # largest term is 1, so the sum is >= 1.
        shifted = np.exp(logits[members] - logits[members].max())
        out[members] = shifted / shifted.sum()
    return out.astype(np.float64)


def reference_gradient(x: SoftmaxInput) -> np.ndarray:
    """[num_edges] float64: d sum(softmax * messages) / d logits, in ``np.longdouble``:
    ``alpha_i * (m_i - sum_{j in segment} alpha_j m_j)``; 0 for masked edges."""
    alpha = reference_softmax(x).astype(np.longdouble)
    messages = x.messages.astype(np.longdouble)
    weighted = np.zeros(x.num_segments, np.longdouble)
    np.add.at(weighted, x.segment_ids, alpha * messages)
    return (alpha * (messages - weighted[x.segment_ids])).astype(np.float64)
