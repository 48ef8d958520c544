"""Op guards: a failing op rewritten at its site, the way its maintainers would write the fix.

An op guard replaces the output of every op of one type (``Sqrt``, ``Log``, ``RealDiv``...)
built inside one layer's ``call`` with the same op on a guarded input: a domain clamp, an
epsilon, a capped or shifted argument, a division that is 0 where its denominator is. It
acts on the op however the user wrote it (``tf.sqrt``, ``keras.ops.sqrt``, ``x ** 0.5``
under ``Pow``, ``tf.norm``'s own ``Sqrt``), because it rewrites the op TensorFlow builds
(``compat.tf_private.op_callback_first``), not the Python call; the gradient tape then
differentiates the guarded op, so a guard repairs the gradient of an op whose forward value
was finite (``SqrtGrad`` at 0) too.

Every bound comes from the dtype the op computes in (docs/doctor.md, "Why each guard is
right"): ``eps`` is its machine epsilon, ``tiny`` its smallest normal number, and the
``exp`` cap half of ``log(max)``.

A guarded layer records each op it rewrote (``sites``): its type, its name, and the line of
the user's code that built it (the innermost frame outside TensorFlow, Keras, the standard
library and this module), which the doctor prints as the fix.
"""

from __future__ import annotations

import ast
import functools
import inspect
import linecache
import math
import sys
import sysconfig
import threading
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import keras
import numpy as np
import tensorflow as tf

from stability.compat.keras_layers import nested_layers
from stability.compat.tf_private import op_callback_first, record_identity
from stability.core.graph_function import graph_function
from stability.model.remedy import OP_GUARD

#: A guard's rewrite: the op's inputs -> its guarded outputs, or None to leave the op alone.
Rewrite = Callable[[Sequence[tf.Tensor]], "list[tf.Tensor] | None"]


@dataclass(frozen=True)
class OpGuard:
    """One guard: the remedy's ``name`` (``guard_sqrt``), the op types it rewrites, what it
    computes instead (``label``, with ``X`` for the op's input), why that is right
    (``why``), and the expression a user writes for it (``code(call, args)``, from the
    function the user called and its arguments' source text)."""

    name: str
    op_types: tuple[str, ...]
    label: str
    why: str
    rewrite: Rewrite
    code: Callable[[str, Sequence[str]], str]
    #: Names a user's call to the op has (``sqrt`` in ``tf.sqrt``, ``keras.ops.sqrt``).
    calls: tuple[str, ...] = ()
    #: A segmented guard's rewrite also takes the segment ids its op's rows are grouped by
    #: (``segment_ids``): ``rewrite(inputs, ids)``; it leaves an op without them alone.
    segmented: bool = False
    #: The class of fix the guard is (``stability.model.remedy.FIX_CLASSES``): an op guard,
    #: or, for a guard that recomputes what the op means, the class its change is.
    fix_class: str = OP_GUARD
    #: A guard whose rewrite reads the ops that made its op's inputs: ``rewrite(inputs,
    #: made)``, ``made(tensor)`` the ``Made`` op of a tensor built in the guarded call (None
    #: for another); it leaves an op whose inputs were made otherwise alone.
    reads_producers: bool = False


@dataclass(frozen=True)
class Made:
    """The op that made a tensor in a guarded call: its type, inputs and attributes."""

    type: str
    inputs: tuple[Any, ...]
    attrs: dict[str, Any]


@dataclass(frozen=True)
class Site:
    """An op a guard rewrote: the guard, the op's type and name, and the user's line that
    built it."""

    guard: str
    op_type: str
    op_name: str
    file: str | None
    line: int | None
    #: The columns of the expression on that line that built the op (Python's own
    #: position of the frame's instruction), where Python gives them.
    col: int | None = None
    end_col: int | None = None
    #: Whether the guard changed a value of the op's outputs, where it saw them (an eager
    #: call); None in a traced step, whose values are not known when the op is built.
    changed: bool | None = None
    #: A segmented guard's segment ids as the user's code names them (the ids argument of
    #: the segment reduction the op feeds), where the line says; None otherwise.
    segments: str | None = None
    #: The last line of an expression written over several lines (``col`` is then on
    #: ``line`` and ``end_col`` on ``end_line``); None for one line.
    end_line: int | None = None


def eps(dtype: tf.DType) -> float:
    """The machine epsilon of a float dtype."""
    return float(np.finfo(dtype.as_numpy_dtype).eps)


def tiny(dtype: tf.DType) -> float:
    """The smallest normal number of a float dtype: smaller results are flushed to 0 on CPU."""
    return float(np.finfo(dtype.as_numpy_dtype).tiny)


def exp_cap(dtype: tf.DType) -> float:
    """Half of ``log(max)``: ``exp`` of it, squared (as a variance or a gradient of a product
    squares it) or summed over up to ``sqrt(max)`` terms, is still finite."""
    return 0.5 * math.log(float(np.finfo(dtype.as_numpy_dtype).max))


def _floating(inputs: Sequence[tf.Tensor]) -> bool:
    return bool(inputs) and inputs[0].dtype.is_floating


def _const(value: float, like: tf.Tensor) -> tf.Tensor:
    return tf.constant(value, like.dtype)


def _sqrt(inputs: Sequence[tf.Tensor]) -> list[tf.Tensor]:
    # Below eps (of an O(1) quantity) x is rounding noise; the floor keeps sqrt's derivative
    # 1 / (2 sqrt(x)) under 1 / (2 sqrt(eps)) (1448 in float32), and maximum sends no
    # gradient to x below the floor, so sqrt(0)'s infinite slope never reaches the weights.
    (x,) = inputs
    return [tf.sqrt(tf.maximum(x, _const(eps(x.dtype), x)))]


def _rsqrt(inputs: Sequence[tf.Tensor]) -> list[tf.Tensor]:
    # The same floor as sqrt's: 1 / sqrt(x) stays under 1 / sqrt(eps) and x <= 0 gets no NaN.
    (x,) = inputs
    return [tf.math.rsqrt(tf.maximum(x, _const(eps(x.dtype), x)))]


def _log(inputs: Sequence[tf.Tensor]) -> list[tf.Tensor]:
    # log is exact for every normal number, so only 0, denormals (flushed to 0 on CPU) and
    # negatives are raised, to tiny: log(tiny) is -87.3 in float32 instead of -inf.
    (x,) = inputs
    return [tf.math.log(tf.maximum(x, _const(tiny(x.dtype), x)))]


def _log_zero(inputs: Sequence[tf.Tensor]) -> list[tf.Tensor]:
    # The log of an empty sum (a node without incoming edges in a log-sum-exp aggregation)
    # is -inf, and log(tiny) = -87.3 is finite but still an outlier that the next layer
    # multiplies up. Scatter libraries give an empty segment 0 (pytorch_scatter's
    # nan_to_num(neginf=0)): below tiny the result is 0, and the inner where gives the
    # discarded branch a finite input (1), so its gradient is 0, not 1 / 0 (double where).
    (x,) = inputs
    return [_outside_is_zero(tf.greater_equal(x, _const(tiny(x.dtype), x)), x, tf.math.log)]


def _outside_is_zero(
    inside: tf.Tensor, x: tf.Tensor, f: Callable[[tf.Tensor], tf.Tensor]
) -> tf.Tensor:
    """``f(x)`` where ``inside``, else 0: the double-where pattern. The inner where gives
    the discarded branch a finite input (1), so its gradient is 0 and not ``f'`` at a point
    outside ``f``'s domain (an outer where alone sends NaN * 0 = NaN back through it)."""
    safe = tf.where(inside, x, tf.ones_like(x))
    return tf.where(inside, f(safe), tf.zeros_like(x))


def _log_zero_code(call: str, args: Sequence[str]) -> str:
    x = args[0] if args else "x"
    return f"tf.where({x} >= TINY, {call}(tf.where({x} >= TINY, {x}, 1.0)), 0.0)"


def _arc(fn: Callable[[tf.Tensor], tf.Tensor]) -> Rewrite:
    def rewrite(inputs: Sequence[tf.Tensor]) -> list[tf.Tensor]:
        # A cosine computed as a normalized dot product rounds past +-1 by an ulp or so; one
        # eps inside the domain keeps acos' slope 1 / sqrt(1 - x^2) under 1 / sqrt(2 eps).
        (x,) = inputs
        bound = 1.0 - eps(x.dtype)
        return [fn(tf.clip_by_value(x, _const(-bound, x), _const(bound, x)))]

    return rewrite


def _exp_cap(inputs: Sequence[tf.Tensor]) -> list[tf.Tensor]:
    # exp(min(x, log(max) / 2)) is at most sqrt(max): finite, and so is its square.
    (x,) = inputs
    return [tf.exp(tf.minimum(x, _const(exp_cap(x.dtype), x)))]


def _exp_shift(inputs: Sequence[tf.Tensor]) -> list[tf.Tensor]:
    # exp(x - max x) scales every term by the same exp(-max x), which cancels in a ratio of
    # them (a softmax); its largest term is exactly 1, so it neither overflows nor is all 0.
    # The max is a constant to the tape, as in every stable softmax: the ratio's gradient
    # does not depend on it.
    (x,) = inputs
    top = tf.stop_gradient(tf.reduce_max(x))
    top = tf.where(tf.math.is_finite(top), top, tf.zeros_like(top))  # an empty or inf x
    return [tf.exp(x - top)]


def _divide(inputs: Sequence[tf.Tensor]) -> list[tf.Tensor]:
    # x / 0 becomes 0, not inf or NaN (an empty neighbourhood's mean, a softmax whose terms
    # all underflowed): TensorFlow's divide_no_nan, whose gradient is 0 there too.
    x, y = inputs
    return [tf.math.divide_no_nan(x, y)]


def _divide_floor(inputs: Sequence[tf.Tensor]) -> list[tf.Tensor]:
    # A divisor that should be a scale (a predicted standard deviation, a norm, a degree)
    # and comes out tiny makes the quotient overflow long before it is 0: a softplus sigma
    # of 1e-19 squares a residual of 10 into 1e40. Below eps such a scale is rounding noise
    # (as for sqrt's floor), so its magnitude is raised to eps, keeping its sign; the
    # quotient is then at most |x| / eps, and maximum/minimum send no gradient to a divisor
    # below the floor.
    x, y = inputs
    floor = _const(eps(y.dtype), y)
    return [x / tf.where(y < 0, tf.minimum(y, -floor), tf.maximum(y, floor))]


def _divide_floor_code(call: str, args: Sequence[str]) -> str:
    x, y = _two(args)
    # A call, not ``x / ...``: the dividend's text may be an operation without its brackets.
    return f"tf.math.divide({x}, tf.where({y} < 0, tf.minimum({y}, -EPS), tf.maximum({y}, EPS)))"


def _multiply(inputs: Sequence[tf.Tensor]) -> list[tf.Tensor]:
    # inf * 0 is NaN (a -inf mask times the 0 of an edge that is there, an overflowed exp
    # times a 0 weight). A non-finite factor is taken as 0 where the other factor is 0, so
    # the product is 0; every other product, and its gradient, is x * y's. Each factor is
    # replaced inside the product (the double-where pattern): the gradient of a discarded
    # inf * 0 branch would be NaN.
    x, y = inputs
    x_safe = tf.where(tf.equal(y, 0) & ~tf.math.is_finite(x), tf.zeros_like(x), x)
    y_safe = tf.where(tf.equal(x, 0) & ~tf.math.is_finite(y), tf.zeros_like(y), y)
    return [x_safe * y_safe]


def _multiply_code(call: str, args: Sequence[str]) -> str:
    x, y = _two(args)
    return f"tf.math.multiply_no_nan({x}, {y})"


def _reciprocal(inputs: Sequence[tf.Tensor]) -> list[tf.Tensor]:
    (x,) = inputs
    return [tf.math.divide_no_nan(tf.ones_like(x), x)]


def _pow(inputs: Sequence[tf.Tensor]) -> list[tf.Tensor] | None:
    # x ** y is real for x > 0 only (unless y is an integer), and infinite at x = 0 for
    # y < 0 (deg ** -0.5 of an isolated node). Outside the domain the result is 0, as in
    # PyG's gcn_norm; the inner where gives the discarded branch a finite input (1), so its
    # gradient is finite too (the double-where pattern).
    x, y = inputs
    static = tf.get_static_value(y)
    integral = static is not None and np.all(np.equal(np.mod(static, 1), 0))
    if integral and np.all(np.asarray(static) >= 0):
        return None  # a polynomial: defined everywhere
    inside = tf.not_equal(x, 0) if integral else tf.greater(x, 0)
    return [_outside_is_zero(inside, x, lambda safe: tf.pow(safe, y))]


def _segment_max(inputs: Sequence[tf.Tensor]) -> list[tf.Tensor]:
    # TensorFlow documents that a segment no element maps to gets the dtype's lowest number
    # (-3.4e38 in float32), which is not the max of anything: a node no edge enters gets
    # it, and a sum with it (a log-sum-exp adds the max back) or a product by a weight
    # overflows. Scatter libraries give an empty segment 0 (torch_scatter's scatter_max),
    # and so does this guard. A real max at the lowest number needs an input at the
    # overflow threshold already. The gradient is unchanged: no element maps to an empty
    # segment, and where sends nothing back through the discarded lowest number.
    data, ids, count = inputs
    raw = tf.math.unsorted_segment_max(data, ids, count)
    empty = tf.equal(raw, tf.constant(raw.dtype.min, raw.dtype))
    return [tf.where(empty, tf.zeros_like(raw), raw)]


def _segment_max_code(call: str, args: Sequence[str]) -> str:
    whole = f"{call}({', '.join(args)})"
    return f"tf.where({whole} > LOWEST, {whole}, 0.0)"


def _wrapped(inner: str) -> Callable[[str, Sequence[str]], str]:
    """``f(g(arg, ...))`` as code: ``inner`` is a template on ``{ns}`` (the namespace the
    user called the op from) and ``{x}`` (its first argument)."""

    def code(call: str, args: Sequence[str]) -> str:
        ns = call.rpartition(".")[0] or "tf"
        rest = "".join(f", {a}" for a in args[1:])
        return f"{call}({inner.format(ns=_namespace(ns), x=args[0] if args else 'x')}{rest})"

    return code


def _sqrt_code(call: str, args: Sequence[str]) -> str:
    """The sqrt guard as code; ``tf.norm(v, ...)`` (whose ``Sqrt`` is its own) written out
    as the root of the guarded sum of squares."""
    if not call.endswith("norm"):
        return _wrapped("{ns}.maximum({x}, EPS)")(call, args)
    ns = _namespace(call.rpartition(".")[0] or "tf")
    total = "reduce_sum" if ns == "tf" else "sum"
    x = args[0] if args else "x"
    rest = "".join(f", {a}" for a in args[1:] if not a.startswith("ord="))
    return f"{ns}.sqrt({ns}.maximum({ns}.{total}({ns}.square({x}){rest}), EPS))"


def _namespace(ns: str) -> str:
    """The namespace whose ``maximum``/``clip_by_value`` a guard's code uses: ``tf`` for any
    of TensorFlow's (``tf.math``), else the user's (``keras.ops``, ``K``, ``ops``)."""
    return "tf" if ns.split(".")[0] in ("tf", "tensorflow") else ns


def _two(args: Sequence[str]) -> tuple[str, str]:
    """The first two arguments' source text (``x`` and ``y`` where the call has fewer)."""
    x, y = [*args, *("x", "y")[len(args) :]][:2]
    return x, y


def _pow_code(call: str, args: Sequence[str]) -> str:
    x, y = _two(args)
    return f"tf.where({x} > 0, tf.pow(tf.where({x} > 0, {x}, 1.0), {y}), 0.0)"


def _divide_code(call: str, args: Sequence[str]) -> str:
    x, y = _two(args)
    return f"tf.math.divide_no_nan({x}, {y})"


def _exp_shift_code(call: str, args: Sequence[str]) -> str:
    x = args[0] if args else "x"
    return f"{call}({x} - tf.stop_gradient(tf.reduce_max({x})))"


def _segment_count(ids: tf.Tensor) -> tf.Tensor:
    # Enough segments for every id present (an empty ids tensor gives 0): the result is
    # gathered back at the ids, so segments no row maps to are never read.
    return tf.maximum(tf.reduce_max(ids) + 1, tf.zeros([], ids.dtype))


def _segment_top(x: tf.Tensor, ids: tf.Tensor) -> tf.Tensor:
    """Each row's segment maximum of ``x`` ``[rows, ...]`` by ``ids`` ``[rows]``, gathered
    back to the rows: a constant to the tape (as in every stable softmax, the ratio's
    gradient does not depend on it), and 0 where it is not finite (an inf row)."""
    top = tf.math.unsorted_segment_max(x, ids, _segment_count(ids))
    top = tf.stop_gradient(tf.gather(top, ids))
    return tf.where(tf.math.is_finite(top), top, tf.zeros_like(top))


def _exp_segment_shift(inputs: Sequence[tf.Tensor], ids: tf.Tensor) -> list[tf.Tensor]:
    # exp(x - max of x over its segment): each segment's terms are scaled by their own
    # exp(-max), which cancels in the segment's ratio (the softmax over a node's edges);
    # each segment's largest term is exactly 1. A shift by the batch's one max (guard_exp_shift)
    # underflows every term of a segment far below that max, and its sum is 0.
    (x,) = inputs
    return [tf.exp(x - _segment_top(x, ids))]


def _softmax_segment(inputs: Sequence[tf.Tensor], ids: tf.Tensor) -> list[tf.Tensor]:
    # The softmax over each segment's rows (a node's incoming edges, a graph's nodes) in
    # place of the op's softmax over its last axis: the rows are grouped by the ids of the
    # segment sum the weights feed, which is what the weights are normalized for. Shifted by
    # each segment's max, so its largest term is 1 and its sum at least 1: never 0 / 0.
    (x,) = inputs
    terms = tf.exp(x - _segment_top(x, ids))
    total = tf.gather(tf.math.unsorted_segment_sum(terms, ids, _segment_count(ids)), ids)
    return [terms / total]


def _exp_segment_shift_code(call: str, args: Sequence[str]) -> str:
    x = args[0] if args else "x"
    return (
        f"{call}({x} - tf.stop_gradient(tf.gather(tf.math.unsorted_segment_max({x}, IDS, "
        "tf.reduce_max(IDS) + 1), IDS)))"
    )


def _softmax_segment_code(call: str, args: Sequence[str]) -> str:
    x = args[0] if args else "x"
    # The terms are named once (an assignment expression) so the line states them once.
    shifted = _exp_segment_shift_code("tf.exp", [x])
    return (
        f"((terms := {shifted}) / tf.gather(tf.math.unsorted_segment_sum(terms, IDS, "
        "tf.reduce_max(IDS) + 1), IDS))"
    )


#: Ops a tensor passes through unchanged in value (a variance's ``stop_gradient(mean)``).
_PASS_THROUGH = frozenset({"StopGradient", "Identity", "Snapshot"})
#: A squared-mean difference reaches back at most this many pass-through ops to its means.
_PASS_DEPTH = 3


def _unwrapped(t: Any, made: Callable[[Any], Made | None]) -> tuple[Any, Made | None]:
    """``t`` and its op, past the ops that pass it through unchanged."""
    op = made(t)
    for _ in range(_PASS_DEPTH):
        if op is None or op.type not in _PASS_THROUGH:
            break
        t = op.inputs[0]
        op = made(t)
    return t, op


def _same(a: Any, b: Any) -> bool:
    """Whether two tensors are one: the same object eagerly, the same name in a graph
    (where each read of an op's inputs may wrap them anew)."""
    if a is b:
        return True
    try:
        return bool(a.name == b.name and a.graph is b.graph)
    except AttributeError:  # eager tensors have no name
        return False


def _squared(t: Any, made: Callable[[Any], Made | None]) -> Any | None:
    """The ``x`` that ``t`` is the square of (``Square(x)``, ``x * x``, ``x ** 2``), or None."""
    _, op = _unwrapped(t, made)
    if op is None:
        return None
    if op.type == "Square":
        return op.inputs[0]
    if op.type == "Mul" and _same(op.inputs[0], op.inputs[1]):
        return op.inputs[0]
    if op.type == "Mul":  # mean(x) * mean(x), two ops of one mean
        a, b = (_mean_of(each, made) for each in op.inputs)
        if a and b and _same(a[0], b[0]) and np.array_equal(a[1], b[1]) and a[2] == b[2]:
            return op.inputs[0]
    if op.type == "Pow" and tf.get_static_value(op.inputs[1]) == 2:
        return op.inputs[0]
    return None


def _mean_of(t: Any, made: Callable[[Any], Made | None]) -> tuple[Any, Any, bool] | None:
    """``(x, axes, keepdims)`` where ``t`` is ``mean(x, axes, keepdims)``, or None."""
    _, op = _unwrapped(t, made)
    if op is None or op.type != "Mean":
        return None
    axes = tf.get_static_value(op.inputs[1])
    if axes is None:
        return None
    return op.inputs[0], np.atleast_1d(axes), bool(op.attrs.get("keep_dims", False))


def _variance_centered(
    inputs: Sequence[tf.Tensor], made: Callable[[Any], Made | None]
) -> list[tf.Tensor] | None:
    # E[x^2] - E[x]^2 subtracts two numbers of about mean^2 and keeps only ulp(mean^2) of
    # their difference: a feature of mean 1000 and variance 0.3 gets a float32 variance of
    # rounding noise (often 0, or negative, and then NaN under a sqrt). Subtracting the mean
    # first, as tf.nn.moments and numpy.var do, squares the deviations themselves, which are
    # exact to ulp(x). The inner mean is a constant to the tape, as in tf.nn.moments: the
    # deviations sum to 0, so the variance's gradient does not go through it.
    left, right = inputs
    variance = _axes_variance(left, right, made)
    if variance is None:
        variance = _segment_variance(left, right, made)
    if variance is None or not variance.shape.is_compatible_with(left.shape):
        return None
    shape = tf.broadcast_dynamic_shape(tf.shape(left), tf.shape(right))
    return [tf.broadcast_to(variance, shape)]


def _axes_variance(left: Any, right: Any, made: Callable[[Any], Made | None]) -> Any | None:
    """``mean(square(x - mean(x)))`` where ``left - right`` is ``mean(square(x), axes) -
    square(mean(x, axes))``; None for another difference."""
    squares = _mean_of(left, made)
    mean = _squared(right, made)
    mean = _mean_of(mean, made) if mean is not None else None
    if squares is None or mean is None:
        return None
    x = _squared(squares[0], made)
    same_axes = np.array_equal(np.sort(squares[1]), np.sort(mean[1]))
    if x is None or not _same(x, mean[0]) or not same_axes:
        return None
    axes = [int(a) for a in squares[1]]
    center = tf.stop_gradient(tf.reduce_mean(x, axis=axes, keepdims=True))
    return tf.reduce_mean(tf.square(x - center), axis=axes, keepdims=squares[2])


@dataclass(frozen=True)
class _SegmentMean:
    """A mean over segments as a graph layer writes it: ``SegmentMean(x, ids)``, or a
    segment sum (``reducer``, over ``num_segments``) divided by ``count`` (a node's degree,
    a graph's size; ``tf.math.unsorted_segment_mean`` is one)."""

    x: Any
    ids: Any
    reducer: str
    num_segments: Any = None
    count: Any = None
    #: The division by the count as the user wrote it: ``DivNoNan`` gives an empty
    #: segment (count 0) a mean of 0 where ``RealDiv`` gives NaN; the guard keeps it.
    divide: str = "RealDiv"

    def of(self, values: Any) -> Any:
        """The same mean of ``values`` (rows as ``x``'s)."""
        if self.reducer == "SegmentMean":
            return tf.math.segment_mean(values, self.ids)
        if self.reducer == "SegmentSum":
            summed = tf.math.segment_sum(values, self.ids)
        else:
            summed = tf.math.unsorted_segment_sum(values, self.ids, self.num_segments)
        if self.divide == "DivNoNan":
            return tf.math.divide_no_nan(summed, self.count)
        return summed / self.count

    def matches(self, other: _SegmentMean, made: Callable[[Any], Made | None]) -> bool:
        """Whether ``other`` is the same mean: the same reduction of the same ids into as
        many segments, divided by the same count (each ``unsorted_segment_mean`` counts
        its segments anew: the same ops on the same ids)."""
        same_ops = (self.reducer, self.divide) == (other.reducer, other.divide)
        return same_ops and all(
            _equivalent(a, b, made)
            for a, b in (
                (self.ids, other.ids),
                (self.num_segments, other.num_segments),
                (self.count, other.count),
            )
        )


#: How many ops deep two tensors are compared op by op (``_equivalent``): a segment
#: count is ``Maximum(Reshape(UnsortedSegmentSum(Fill(Shape(ids)), ...)), 1)``.
_EQUIVALENCE_DEPTH = 6


def _equivalent(a: Any, b: Any, made: Callable[[Any], Made | None], depth: int = 0) -> bool:
    """Whether ``a`` and ``b`` hold the same values by construction: one tensor, equal
    known values, or the same op of equivalent inputs (None and None: both absent)."""
    if a is None or b is None:
        return a is None and b is None
    if _same(a, b):
        return True
    known = [tf.get_static_value(t) for t in (a, b)]
    if known[0] is not None and known[1] is not None:
        return bool(np.shape(known[0]) == np.shape(known[1]) and np.all(known[0] == known[1]))
    op_a, op_b = made(a), made(b)
    if depth >= _EQUIVALENCE_DEPTH or op_a is None or op_b is None:
        return False
    # An op's attributes are not read: its dtype and shape stand for them (a Cast's
    # target, a reduction's keep_dims).
    alike = a.dtype == b.dtype and str(a.shape) == str(b.shape)
    if not alike or op_a.type != op_b.type or len(op_a.inputs) != len(op_b.inputs):
        return False
    pairs = zip(op_a.inputs, op_b.inputs, strict=True)
    return all(_equivalent(x, y, made, depth + 1) for x, y in pairs)


_SEGMENT_SUMS = frozenset({"UnsortedSegmentSum", "SegmentSum"})


def _segment_mean_of(t: Any, made: Callable[[Any], Made | None]) -> _SegmentMean | None:
    """The segment mean ``t`` is, or None."""
    _, op = _unwrapped(t, made)
    if op is None:
        return None
    if op.type == "SegmentMean":
        return _SegmentMean(op.inputs[0], op.inputs[1], op.type)
    if op.type not in ("RealDiv", "DivNoNan"):
        return None
    _, summed = _unwrapped(op.inputs[0], made)
    if summed is None or summed.type not in _SEGMENT_SUMS:
        return None
    segments = summed.inputs[2] if len(summed.inputs) > 2 else None
    return _SegmentMean(
        summed.inputs[0], summed.inputs[1], summed.type, segments, op.inputs[1], op.type
    )


def _segment_variance(left: Any, right: Any, made: Callable[[Any], Made | None]) -> Any | None:
    """The mean over each segment of ``square(x - its segment's mean)`` where ``left -
    right`` is ``segment_mean(square(x)) - square(segment_mean(x))`` (a graph norm's
    per-graph or per-node variance, written with segment sums and counts); None for
    another difference. The centre is the user's own mean (``right``'s root), gathered
    back to each row, and the variance is divided by ``left``'s count as the user's was."""
    squares = _segment_mean_of(left, made)
    root = _squared(right, made)
    mean = _segment_mean_of(root, made) if root is not None else None
    if squares is None or mean is None or not squares.matches(mean, made):
        return None
    x = _squared(squares.x, made)
    if x is None or not _same(x, mean.x):
        return None
    center = tf.gather(tf.stop_gradient(root), squares.ids)
    return squares.of(tf.square(x - center))


def _variance_centered_code(call: str, args: Sequence[str]) -> str:
    """``mean(square(x - mean(x, axes, keepdims=True)), axes)`` from the user's
    ``mean(square(x), axes) - square(mean)``, in the user's own calls (for a segment mean,
    ``x`` less the user's mean gathered back to its rows: ``_segment_centered_code``);
    where the left term is written otherwise, the guard's expression."""
    left = args[0] if args else ""
    fallback = f"mean(square(x - mean(x)))  # in place of {call}({', '.join(args)})"
    node = _expression(left)
    segmented = _segment_centered_code(node, _expression(args[1]) if len(args) > 1 else None)
    if segmented is not None:
        return segmented
    if not isinstance(node, ast.Call) or not node.args:
        return fallback
    mean = ast.unparse(node.func)
    inner = node.args[0]
    ns = mean.rpartition(".")[0] or "tf"
    root = _square_root_of(inner)
    if root is None:
        return fallback
    # The user's own square call where it is one; for ``x ** 2`` or ``x * x``, the namespace's.
    square = _called(inner) if isinstance(inner, ast.Call) else f"{ns}.square"
    x = ast.unparse(root)
    rest = [ast.unparse(a) for a in node.args[1:]]
    kept = [f"{k.arg}={ast.unparse(k.value)}" for k in node.keywords if k.arg != "keepdims"]
    keep = [f"{k.arg}={ast.unparse(k.value)}" for k in node.keywords if k.arg == "keepdims"]
    center = f"{mean}({', '.join([x, *rest, *kept, 'keepdims=True'])})"
    return f"{mean}({', '.join([f'{square}({x} - {center})', *rest, *kept, *keep])})"


def _expression(text: str) -> ast.expr | None:
    try:
        return ast.parse(text, mode="eval").body
    except SyntaxError:
        return None


def _square_root_of(node: ast.AST | None) -> ast.expr | None:
    """What ``node`` squares (``square(m)``, ``m ** 2``, ``m * m``), or None."""
    if isinstance(node, ast.Call) and len(node.args) == 1 and _called(node).endswith("square"):
        return node.args[0]
    if not isinstance(node, ast.BinOp):
        return None
    power = isinstance(node.op, ast.Pow) and isinstance(node.right, ast.Constant)
    if power and node.right.value == 2:
        return node.left
    product = isinstance(node.op, ast.Mult) and ast.dump(node.left) == ast.dump(node.right)
    return node.left if product else None


def _called(node: ast.Call) -> str:
    return ast.unparse(node.func)


def _segment_centered_code(left: ast.expr | None, right: ast.expr | None) -> str | None:
    """``left`` with the square inside its segment reduction (``segment_sum(square(x),
    ids, n) / count``, ``segment_mean(x ** 2, ids)``) taken of ``x - gather(m, ids)``,
    ``m`` the mean ``right`` squares as the user wrote it (``take`` in Keras ops); None
    where ``left`` holds no segment reduction of a square."""
    root = _square_root_of(right)
    if left is None or root is None:
        return None
    for reducer in ast.walk(left):
        if not isinstance(reducer, ast.Call) or "segment" not in _called(reducer):
            continue
        x = _square_root_of(reducer.args[0]) if len(reducer.args) >= 2 else None
        if x is None:
            continue
        ns = _called(reducer).rpartition(".")[0] or "tf"
        ids = reducer.args[1]
        gather = f"{ns}.take" if ns.split(".")[-1] == "ops" else "tf.gather"
        center = ast.Call(ast.parse(gather, mode="eval").body, [root, ids], [])
        if gather.endswith("take"):
            center.keywords = [ast.keyword("axis", ast.Constant(0))]
        written = reducer.args[0]  # the user's own square call, where it is one
        name = written.func if isinstance(written, ast.Call) else _expression(f"{ns}.square")
        square = ast.Call(name, [ast.BinOp(x, ast.Sub(), center)], [])
        reducer.args[0] = square
        return ast.unparse(left)
    return None


_EPS = "machine epsilon"
GUARDS: tuple[OpGuard, ...] = (
    OpGuard(
        "guard_sqrt",
        ("Sqrt",),
        "sqrt(maximum(X, eps))",
        f"below the {_EPS} X is rounding noise; the floor bounds sqrt's slope by "
        "1 / (2 sqrt(eps)), and X below it gets no gradient",
        _sqrt,
        _sqrt_code,
        ("sqrt", "norm"),
    ),
    OpGuard(
        "guard_rsqrt",
        ("Rsqrt",),
        "rsqrt(maximum(X, eps))",
        f"the same floor as sqrt's: 1 / sqrt(X) stays under 1 / sqrt(eps), the {_EPS}",
        _rsqrt,
        _wrapped("{ns}.maximum({x}, EPS)"),
        ("rsqrt",),
    ),
    OpGuard(
        "guard_log",
        ("Log",),
        "log(maximum(X, tiny))",
        "log is exact on every normal number; only 0, denormals (flushed to 0 on CPU) and "
        "negatives are raised to the smallest normal number, whose log is finite",
        _log,
        _wrapped("{ns}.maximum({x}, TINY)"),
        ("log",),
    ),
    OpGuard(
        "guard_log_zero",
        ("Log",),
        "where(X >= tiny, log(where(X >= tiny, X, 1)), 0)",
        "the log of an empty sum is -inf, and log(tiny) an outlier of -87.3; an empty "
        "segment gets 0, as scatter libraries give it, and the inner where gives the "
        "discarded branch a finite input, so its gradient is 0",
        _log_zero,
        _log_zero_code,
        ("log",),
    ),
    OpGuard(
        "guard_acos",
        ("Acos",),
        "acos(clip(X, -1 + eps, 1 - eps))",
        "a cosine from a normalized dot product rounds past +-1; one eps inside keeps the "
        "slope under 1 / sqrt(2 eps)",
        _arc(tf.acos),
        _wrapped("{ns}.clip_by_value({x}, -1.0 + EPS, 1.0 - EPS)"),
        ("acos", "arccos"),
    ),
    OpGuard(
        "guard_asin",
        ("Asin",),
        "asin(clip(X, -1 + eps, 1 - eps))",
        "as acos: one eps inside [-1, 1] keeps the slope finite",
        _arc(tf.asin),
        _wrapped("{ns}.clip_by_value({x}, -1.0 + EPS, 1.0 - EPS)"),
        ("asin", "arcsin"),
    ),
    OpGuard(
        "guard_exp_cap",
        ("Exp",),
        "exp(minimum(X, log(max) / 2))",
        "exp of at most log(max) / 2 is at most sqrt(max): finite, squared or summed",
        _exp_cap,
        _wrapped("{ns}.minimum({x}, CAP)"),
        ("exp",),
    ),
    OpGuard(
        "guard_exp_shift",
        ("Exp",),
        "exp(X - max X)",
        "every term is scaled by the same exp(-max X), which cancels in a ratio of them; "
        "the largest term is 1, so the terms neither overflow nor all vanish",
        _exp_shift,
        _exp_shift_code,
        ("exp",),
    ),
    OpGuard(
        "guard_divide",
        ("RealDiv", "Div"),
        "divide_no_nan(X, Y)",
        "a quotient by exactly 0 (an empty neighbourhood, a sum of underflowed terms) is "
        "0, with a gradient of 0, instead of inf or NaN",
        _divide,
        _divide_code,
        ("divide", "truediv", "div"),
    ),
    OpGuard(
        "guard_divide_floor",
        ("RealDiv", "Div"),
        "X / Y, |Y| raised to at least eps",
        "a divisor that is a scale (a standard deviation, a norm) and comes out tiny makes the "
        "quotient overflow before it is 0; below the machine epsilon it is rounding noise, so "
        "its magnitude is raised to eps and the quotient is at most |X| / eps",
        _divide_floor,
        _divide_floor_code,
        ("divide", "truediv", "div"),
    ),
    OpGuard(
        "guard_multiply",
        ("Mul",),
        "X * Y, a non-finite factor taken as 0 where the other is 0",
        "inf * 0 is NaN; a product by exactly 0 is 0 whatever the other factor (TensorFlow's "
        "multiply_no_nan), and every other product and its gradient are unchanged",
        _multiply,
        _multiply_code,
        ("multiply",),
    ),
    OpGuard(
        "guard_reciprocal",
        ("Reciprocal", "Inv"),
        "divide_no_nan(1, X)",
        "as the division's: 1 / 0 is 0, with a gradient of 0",
        _reciprocal,
        lambda call, args: f"tf.math.divide_no_nan(1.0, {args[0] if args else 'x'})",
        ("reciprocal",),
    ),
    OpGuard(
        "guard_segment_max",
        ("UnsortedSegmentMax",),
        "unsorted_segment_max(X, ...), 0 at an empty segment",
        "TensorFlow gives a segment no element maps to the lowest number of the dtype, which "
        "overflows in the next sum or product; scatter libraries give it 0, and so does the "
        "guard, with the gradient unchanged",
        _segment_max,
        _segment_max_code,
        ("unsorted_segment_max", "segment_max"),
    ),
    OpGuard(
        "guard_pow",
        ("Pow",),
        "where(X > 0, pow(where(X > 0, X, 1), Y), 0)",
        "X ** Y is real for X > 0 (unless Y is an integer) and infinite at 0 for Y < 0; "
        "outside the domain the result is 0 (PyG's gcn_norm), and the inner where gives "
        "the discarded branch a finite input, so its gradient is finite",
        _pow,
        _pow_code,
        ("pow", "power"),
    ),
    OpGuard(
        "guard_exp_segment_shift",
        ("Exp",),
        "exp(X - max of X over its segment)",
        "each segment's terms (a node's edges) are scaled by their own exp(-max), which "
        "cancels in the segment's ratio; each segment's largest term is 1, so no segment's "
        "terms all vanish, as they do under one shift for the whole batch",
        _exp_segment_shift,
        _exp_segment_shift_code,
        ("exp",),
        segmented=True,
        fix_class="stable reformulation",
    ),
    OpGuard(
        "guard_softmax_segment",
        ("Softmax",),
        "softmax of X over its segment",
        "the weights are summed by segment (a node's incoming edges, a graph's nodes), so "
        "each segment's weights are what must sum to 1: a softmax over another axis (one "
        "edge's heads, a length-1 axis, the whole batch) does not normalize them",
        _softmax_segment,
        _softmax_segment_code,
        ("softmax",),
        segmented=True,
        fix_class="architecture change",
    ),
    OpGuard(
        "guard_variance_centered",
        ("Sub",),
        "mean(square(x - mean(x))) in place of mean(square(x)) - square(mean(x))",
        "E[x^2] - E[x]^2 keeps only ulp(mean^2) of a variance (catastrophic cancellation: "
        "0, negative or noise for a feature whose mean is large against its spread); the "
        "deviations from the mean are exact to ulp(x), and their mean square is the variance",
        _variance_centered,
        _variance_centered_code,
        ("subtract",),
        fix_class="stable reformulation",
        reads_producers=True,
    ),
)


def guard_named(name: str) -> OpGuard:
    """The guard called ``name`` (``guard_sqrt``)."""
    return {g.name: g for g in GUARDS}[name]


def guards_for(op_type: str) -> list[OpGuard]:
    """The guards that rewrite ops of ``op_type``."""
    return [g for g in GUARDS if op_type in g.op_types]


#: The ops each guarded layer rewrote, by layer (kept only while the layer lives).
_SITES: weakref.WeakKeyDictionary[Any, list[Site]] = weakref.WeakKeyDictionary()
_ACTIVE = threading.local()


def sites(layer: keras.Layer) -> list[Site]:
    """Every op the guard on ``layer`` rewrote so far (each trace and eager call adds)."""
    return list(_SITES.get(layer, []))


def model_sites(model: keras.Layer) -> list[Site]:
    """Every op the guards on ``model`` and its layers (at any depth) rewrote so far."""
    return [site for layer in [model, *nested_layers(model)] for site in sites(layer)]


def guard_layer(layer: keras.Layer, guard: OpGuard) -> None:
    """Rewrite every op of ``guard``'s types built in ``layer``'s ``call`` (and ``forward``,
    where the layer has one) from now on, and record each in ``sites(layer)``."""
    callback, flush = _rewriting(guard, _SITES.setdefault(layer, []))
    for method in ("call", "forward"):
        original = getattr(layer, method, None)
        if callable(original):
            # An instance attribute shadows the class's method; Keras' __call__ calls it.
            object.__setattr__(layer, method, _under(callback, flush, original))


#: The path a guard of the loss is named by (``guard_log@loss``): a loss is no layer.
LOSS_SITE = "loss"


def guard_loss(loss: Callable[..., Any], guard: OpGuard) -> Callable[..., Any]:
    """``loss`` with every op of ``guard``'s types it builds rewritten from now on, each
    recorded in ``loss_sites`` of the returned loss. A ``keras.losses.Loss`` is guarded in
    place (its ``call``), so Keras still treats it as one; a function is wrapped
    (``functools.wraps``: its name and attributes stay the user's)."""
    if isinstance(loss, keras.losses.Loss):
        callback, flush = _rewriting(guard, _SITES.setdefault(loss, []))
        object.__setattr__(loss, "call", _under(callback, flush, loss.call))
        return loss
    found: list[Site] = []
    callback, flush = _rewriting(guard, found)
    guarded = _under(callback, flush, loss)
    _SITES[guarded] = found
    return guarded


def loss_sites(loss: Callable[..., Any]) -> list[Site]:
    """Every op the guards on ``loss`` (each wrapper of a chain of them) rewrote so far."""
    found: list[Site] = []
    each: Any = loss
    while each is not None:
        found += _SITES.get(each, [])
        each = getattr(each, "__wrapped__", None)
    return found


def _rewriting(guard: OpGuard, found: list[Site]) -> tuple[Callable[..., Any], Callable[[], None]]:
    """An op callback that rewrites ``guard``'s ops, appending each to ``found``, and the
    ``flush`` to run when the guarded call returns. A segmented guard's callback also keeps
    the call's layout (``_Layout``): ``callback.begin(method, args, kwargs)`` starts it."""
    #: (outputs, guarded values) whose tape record waits for the guarded call to end.
    pending: list[tuple[list[tf.Tensor], list[tf.Tensor]]] = []
    layouts: list[_Layout] = []
    made = _Producers()

    def callback(op_type: str, inputs: Any, attrs: Any, outputs: Any, **where: Any) -> Any:
        if _ACTIVE.__dict__.get("busy") or _ACTIVE.__dict__.get("surveying"):
            return None
        if guard.reads_producers:
            made.record(op_type, inputs, attrs, outputs)
        layout = layouts[-1] if layouts else None
        index = layout.built(op_type, outputs) if layout is not None else None
        if op_type not in guard.op_types or not _floating(inputs):
            return None
        # Eagerly, the ops the rewrite runs come back to this callback (TensorFlow guards
        # against that only while tracing): the flag leaves them alone.
        _ACTIVE.busy = True
        segments = None  # the user's text of a segmented guard's ids, where read
        try:
            if guard.segmented:
                ids, segments = layout.segment_ids(index) if layout else (None, None)
                new = None if ids is None else guard.rewrite(inputs, ids)
            elif guard.reads_producers:
                new = guard.rewrite(inputs, made.get)
            else:
                new = guard.rewrite(inputs)
            returned = None if new is None else [tf.identity(t) for t in new]
        finally:
            _ACTIVE.busy = False
        if returned is None:
            return None
        # The tape records ``returned`` as the raw op's outputs, from the raw inputs (its
        # gradient would be the raw op's: 1 / x at x = 0 for Log); once the raw op is
        # recorded, ``flush`` records them again as the identity of the guarded values.
        pending.append((returned, new))
        name = str(where.get("op_name") or op_type)
        file, line, col, end_col, end_line = user_frame()
        site = Site(
            guard.name,
            op_type,
            name,
            file,
            line,
            col,
            end_col,
            changed=_changed(outputs, new),
            segments=segments,
            end_line=end_line,
        )
        found.append(site)
        return returned

    def flush() -> None:
        while pending:
            record_identity(*pending.pop())
        made.clear()
        if layouts:
            layouts.pop()

    def begin(method: Callable[..., Any], args: tuple, kwargs: dict) -> None:
        layouts.append(_Layout.survey(method, args, kwargs, guard.op_types))

    if guard.segmented:
        callback.begin = begin  # type: ignore[attr-defined]
    return callback, flush


class _Producers:
    """The op that made each tensor of a guarded call (``Made``): a traced tensor names its
    op (``tensor.op``); an eager one does not, so the callback records it as it is built,
    keeping the tensor alive until the call ends (so its ``id`` is not reused)."""

    def __init__(self) -> None:
        self._eager: dict[int, tuple[Any, Made]] = {}

    def record(self, op_type: str, inputs: Any, attrs: Any, outputs: Any) -> None:
        if not tf.executing_eagerly():
            return
        pairs = dict(zip(attrs[::2], attrs[1::2], strict=True)) if attrs else {}
        # Eagerly, some ops (Mean) reach op callbacks with their type as bytes.
        name = op_type.decode() if isinstance(op_type, bytes) else op_type
        op = Made(name, tuple(inputs), pairs)
        for tensor in outputs if isinstance(outputs, (list, tuple)) else [outputs]:
            self._eager[id(tensor)] = (tensor, op)

    def get(self, tensor: Any) -> Made | None:
        kept = self._eager.get(id(tensor))
        if kept is not None and kept[0] is tensor:
            return kept[1]
        op = getattr(tensor, "op", None)  # an eager tensor has none (AttributeError)
        if op is None:
            return None
        attrs = {"keep_dims": op.get_attr("keep_dims")} if op.type == "Mean" else {}
        return Made(op.type, tuple(op.inputs), attrs)

    def clear(self) -> None:
        self._eager.clear()


#: Ops that reduce rows into segments, with their data (input 0) and ids (input 1): a
#: segmented guard groups its op's rows by the ids of the nearest one its output feeds.
SEGMENT_REDUCERS = frozenset(
    {
        "UnsortedSegmentSum",
        "UnsortedSegmentMax",
        "UnsortedSegmentMin",
        "UnsortedSegmentProd",
        "SegmentSum",
        "SegmentMean",
        "SegmentMax",
    }
)
#: How many ops downstream of a guarded op its segment reduction is looked for.
_SEGMENT_DEPTH = 6


@dataclass
class _Layout:
    """Where, in one call of a guarded method, the segment ids of each op of the guard's
    types are: the call's ``k``-th argument (its leaves flattened, ``tf.nest``) or the
    ``j``-th output of the ``k``-th op the call builds (``("arg", k)``, ``("op", k, j)``;
    None where the op's output feeds no segment reduction). ``survey`` finds them by
    tracing the call once in a ``tf.function`` (nothing is computed); the guarded call then
    counts the ops it builds in the same order and reads the ids from its own tensors."""

    leaves: list[Any]
    places: list[tuple | None]
    #: The user's text of each place's ids (``reducer_ids_text``), or None.
    texts: list[str | None] = field(default_factory=list)
    ops: list[list[Any]] = field(default_factory=list)
    #: How many ops of the guard's types the guarded call has built so far.
    guarded: int = 0

    @classmethod
    def survey(
        cls, method: Callable[..., Any], args: tuple, kwargs: dict, op_types: Sequence[str]
    ) -> _Layout:
        leaves = tf.nest.flatten((args, kwargs))
        slots = [i for i, leaf in enumerate(leaves) if isinstance(leaf, tf.Tensor)]
        built: list[Any] = []
        frames: dict[str, tuple] = {}
        received: list[Any] = []

        def traced(*tensors: Any) -> Any:
            filled = list(leaves)
            for slot, tensor in zip(slots, tensors, strict=True):
                filled[slot] = tensor
            received.extend(tensors)
            a, k = tf.nest.pack_sequence_as((args, kwargs), filled)
            with op_callback_first(_sequence(built, frames)):
                return method(*a, **k)

        specs = [tf.TensorSpec(leaves[i].shape, leaves[i].dtype) for i in slots]
        surveying = _ACTIVE.__dict__.get("surveying", False)
        _ACTIVE.surveying = True  # the guards of this call leave the survey's ops alone
        try:
            # No autograph, as Keras runs a layer's call (its code is not converted): the
            # survey builds the ops the guarded call builds, in the same order.
            graph_function(traced).get_concrete_function(*specs)
        except Exception:  # a call that cannot be traced alone: no op gets segment ids
            return cls(leaves, [])
        finally:
            _ACTIVE.surveying = surveying
        names = {op.name: k for k, op in enumerate(built)}
        args_at = {t.name: slot for slot, t in zip(slots, received, strict=True)}
        reducers = [_reduction(op, names) for op in built if op.type in op_types]
        places = [_place_of(r and r.inputs[1], names, args_at) for r in reducers]
        texts = [r and reducer_ids_text(*frames.get(r.name, ())) for r in reducers]
        return cls(leaves, places, texts)

    def built(self, op_type: str, outputs: Any) -> int | None:
        """Count an op the guarded call built; its index among the guard's ops, if one."""
        if op_type in _UNCOUNTED:
            return None
        self.ops.append(list(outputs) if isinstance(outputs, (list, tuple)) else [outputs])
        return len(self.ops) - 1

    def segment_ids(self, index: int | None) -> tuple[tf.Tensor | None, str | None]:
        """The segment ids of the guard's op built ``index``-th in the call, and the user's
        text of them where known; ``(None, None)`` where the op feeds no segment reduction."""
        if index is None:
            return None, None
        order = self.guarded
        self.guarded += 1
        place = self.places[order] if order < len(self.places) else None
        text = self.texts[order] if order < len(self.texts) else None
        if place is None:
            return None, None
        if place[0] == "arg":
            ids = self.leaves[place[1]]
        elif place[1] < len(self.ops) and place[2] < len(self.ops[place[1]]):
            ids = self.ops[place[1]][place[2]]
        else:
            return None, None
        if not ids.dtype.is_integer or ids.shape.rank not in (None, 1):
            return None, None
        return ids, text


#: Op types not counted in a call's layout: a constant is an op while tracing but not when
#: run eagerly, and a graph makes a placeholder for a variable only the first time a call
#: reads it, so counting either would shift the indices between the survey and the call.
_UNCOUNTED = frozenset({"Const", "Placeholder"})


def _sequence(built: list[Any], frames: dict[str, tuple]) -> Callable[..., Any]:
    """An op callback that appends every op built while tracing to ``built``, in order, and
    keeps the user's frame (``user_frame``) of each segment reduction in ``frames``."""

    def callback(op_type: str, ins: Any, attrs: Any, outputs: Any, **where: Any) -> Any:
        if op_type in _UNCOUNTED:
            return None
        first = outputs[0] if isinstance(outputs, (list, tuple)) and outputs else outputs
        op = getattr(first, "op", None)
        if op is not None:
            built.append(op)
            if op_type in SEGMENT_REDUCERS:
                frames[op.name] = user_frame()
        return None

    return callback


def joined_source(file: str, line: int, end_line: int | None = None) -> tuple[str, int]:
    """Lines ``line`` to ``end_line`` of ``file`` as one line (the first as written, each
    next stripped and joined by a space), and how far the columns of ``end_line`` moved in
    it (add it to a column of that line); one line as it is, with 0."""
    first = linecache.getline(file, line).rstrip("\n")
    if not end_line or end_line <= line:
        return first, 0
    text, shift = first.rstrip(), 0
    for number in range(line + 1, end_line + 1):
        raw = linecache.getline(file, number).rstrip("\n")
        shift = len(text) + 1 - (len(raw) - len(raw.lstrip()))
        text = f"{text} {raw.strip()}"
    return text, shift


def reducer_ids_text(
    file: str | None = None,
    line: int | None = None,
    col: int | None = None,
    end_col: int | None = None,
    end_line: int | None = None,
) -> str | None:
    """The source text of the segment ids a segment reduction was called with on ``line``
    of ``file`` (to ``end_line``, for a call over several lines: its second argument, or
    ``segment_ids=``), the call starting at ``col`` where known; None where the line
    cannot be read or holds no such call."""
    if file is None or line is None:
        return None
    raw, _ = joined_source(file, line, end_line)
    text = raw.strip().removeprefix("return ")
    try:
        tree = ast.parse(text)
    except SyntaxError:
        return None
    shift = len(raw) - len(raw.lstrip()) + len(raw.strip()) - len(text)  # text's column 0
    calls = [
        node
        for node in ast.walk(tree)
        if isinstance(node, ast.Call) and "segment" in ast.unparse(node.func).rsplit(".", 1)[-1]
    ]
    if col is not None:
        calls = [c for c in calls if c.col_offset + shift == col] or calls
    for call in calls:
        ids = [k.value for k in call.keywords if k.arg == "segment_ids"] or call.args[1:2]
        if ids:
            return ast.unparse(ids[0])
    return None


def _reduction(op: Any, names: dict[str, int]) -> Any:
    """The nearest segment reduction (``SEGMENT_REDUCERS``) whose data ``op``'s output
    reaches through ops built in the call; None where there is none."""
    frontier, seen = list(op.outputs), {op.name}
    for _ in range(_SEGMENT_DEPTH):
        following = []
        for tensor in frontier:
            for consumer in tensor.consumers():
                if consumer.name not in names or consumer.name in seen:
                    continue
                if consumer.type in SEGMENT_REDUCERS and consumer.inputs[0].name == tensor.name:
                    return consumer
                seen.add(consumer.name)
                following += consumer.outputs
        frontier = following
    return None


def _place_of(ids: Any, names: dict[str, int], args_at: dict[str, int]) -> tuple | None:
    """Where ``ids`` comes from in the call: an argument's leaf or an op's output."""
    if ids is None:
        return None
    if ids.name in args_at:
        return ("arg", args_at[ids.name])
    if ids.op.name in names:
        return ("op", names[ids.op.name], ids.value_index)
    return None


def producer_types(
    layer: keras.Layer, forward: Callable[[Any], Any], inputs: Any, op_types: Sequence[str]
) -> tuple[str, ...]:
    """The types of the ops that feed, inside ``layer``'s call, an op of ``op_types`` built
    there: its inputs' ops, theirs, and so on while they were built in the call, nearest
    first; with no ``op_types`` (a failure that names no op: weights that do not sum to 1),
    every type the call builds, in the order built. ``forward(inputs)`` (a model that holds
    ``layer``, already built) is traced once in a ``tf.function``; nothing is computed. A
    guard of one of these ops treats a failure whose cause is upstream of the op that shows
    it (an ``exp`` whose terms all underflow shows as the 0 / 0 of the softmax's division)."""
    built: dict[str, Any] = {}
    callback = _recorder(built)
    saved = {m: layer.__dict__.get(m) for m in ("call", "forward")}
    for method in saved:
        original = getattr(layer, method, None)
        if callable(original):
            object.__setattr__(layer, method, _under(callback, lambda: None, original))
    try:
        graph_function(forward).get_concrete_function(inputs)
    finally:
        for method, value in saved.items():
            if value is not None:
                object.__setattr__(layer, method, value)
            elif method in layer.__dict__:
                object.__delattr__(layer, method)
    if not op_types:
        return tuple(dict.fromkeys(op.type for op in built.values()))
    return _ancestor_types(built, op_types)


def function_producer_types(
    fn: Callable[..., Any], args: Sequence[Any], op_types: Sequence[str]
) -> tuple[str, ...]:
    """``producer_types`` for a function (a loss): every op its trace on ``args`` builds is
    its own."""
    built: dict[str, Any] = {}
    callback = _recorder(built)

    def hooked(*values: Any) -> Any:
        with op_callback_first(callback):
            return fn(*values)

    graph_function(hooked).get_concrete_function(*args)
    return _ancestor_types(built, op_types)


def _recorder(built: dict[str, Any]) -> Callable[..., Any]:
    """An op callback that records, by name, every op built while tracing into ``built``."""

    def callback(op_type: str, ins: Any, attrs: Any, outputs: Any, **where: Any) -> Any:
        for tensor in outputs if isinstance(outputs, (list, tuple)) else [outputs]:
            op = getattr(tensor, "op", None)
            if op is not None and not tf.executing_eagerly():
                built[op.name] = op
        return None

    return callback


def _ancestor_types(built: dict[str, Any], op_types: Sequence[str]) -> tuple[str, ...]:
    """Breadth-first from ``built``'s ops of ``op_types`` through their inputs' ops, kept
    to ``built``: the types met, nearest first, without ``op_types`` themselves."""
    queue = [op for op in built.values() if op.type in op_types]
    seen, found = {op.name for op in queue}, []
    while queue:
        op = queue.pop(0)
        for tensor in op.inputs:
            source = tensor.op
            if source.name in seen or source.name not in built:
                continue
            seen.add(source.name)
            queue.append(source)
            if source.type not in op_types and source.type not in found:
                found.append(source.type)
    return tuple(found)


def _under(
    callback: Callable[..., Any], flush: Callable[[], None], method: Callable[..., Any]
) -> Callable[..., Any]:
    """``method`` run with ``callback`` seeing its ops (once however the calls nest), and
    ``flush`` run when it returns."""

    @functools.wraps(method)
    def guarded(*args: Any, **kwargs: Any) -> Any:
        active = getattr(_ACTIVE, "callbacks", set())
        if id(callback) in active:
            return method(*args, **kwargs)
        _ACTIVE.callbacks = active | {id(callback)}
        try:
            begin = getattr(callback, "begin", None)
            if begin is not None:
                begin(method, args, kwargs)
            with op_callback_first(callback):
                return method(*args, **kwargs)
        finally:
            _ACTIVE.callbacks = active
            flush()

    return guarded


def _library_roots() -> tuple[str, ...]:
    roots = {str(Path(__file__).resolve().parent.parent / "compat")}
    for name in ("tensorflow", "keras", "tf_keras", "tensorflow_core", "absl"):
        module = sys.modules.get(name)
        for path in getattr(module, "__path__", []) or []:
            roots.add(str(Path(path).resolve()))
    return tuple(sorted(roots))


def _changed(raw: Any, guarded: Sequence[tf.Tensor]) -> bool | None:
    """Whether ``guarded`` differs from the op's ``raw`` outputs anywhere (NaN against NaN
    is no change); None where they are symbolic (a traced step)."""
    raw = list(raw) if isinstance(raw, (list, tuple)) else [raw]
    if not all(hasattr(t, "numpy") for t in [*raw, *guarded]) or not tf.executing_eagerly():
        return None
    for before, after in zip(raw, guarded, strict=False):
        a, b = np.asarray(before.numpy()), np.asarray(after.numpy())
        if a.shape != b.shape or not np.all((a == b) | (np.isnan(a) & np.isnan(b))):
            return True
    return False


def user_frame() -> tuple[str | None, int | None, int | None, int | None, int | None]:
    """The file, line and columns of the innermost frame outside TensorFlow, Keras, the
    standard library and this module: the user's code that built the op being rewritten.
    The columns are those of the frame's current instruction (``inspect.getframeinfo``'s
    ``positions``, Python 3.11 on): ``traceback.extract_stack`` leaves them out. For an
    expression over several lines, the fifth value is its last line (the start column is
    on the first, the end column on the last); None for one line."""
    roots, here = _library_roots(), str(Path(__file__).resolve())
    paths = sysconfig.get_paths()
    stdlib, installed = paths["stdlib"], (paths["purelib"], paths["platlib"])
    frame = inspect.currentframe()
    while frame is not None:
        filename = frame.f_code.co_filename
        path = str(Path(filename).resolve())
        in_stdlib = path.startswith(stdlib) and not path.startswith(installed)
        if path == here or in_stdlib or path.startswith(roots) or filename.startswith("<"):
            frame = frame.f_back
            continue
        positions = getattr(inspect.getframeinfo(frame, context=0), "positions", None)
        col = getattr(positions, "col_offset", None)
        end_col = getattr(positions, "end_col_offset", None)
        first, last = (
            (positions.lineno, positions.end_lineno) if positions is not None else (None, None)
        )
        if first is not None and last is not None and last != first:
            return filename, first, col, end_col, last  # an expression over several lines
        return filename, frame.f_lineno, col, end_col, None
    return None, None, None, None, None
