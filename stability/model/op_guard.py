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

import functools
import inspect
import math
import sys
import sysconfig
import threading
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import keras
import numpy as np
import tensorflow as tf

from stability.compat.keras_layers import nested_layers
from stability.compat.tf_private import op_callback_first, record_identity

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
    ``flush`` to run when the guarded call returns."""
    #: (outputs, guarded values) whose tape record waits for the guarded call to end.
    pending: list[tuple[list[tf.Tensor], list[tf.Tensor]]] = []

    def callback(op_type: str, inputs: Any, attrs: Any, outputs: Any, **where: Any) -> Any:
        if op_type not in guard.op_types or not _floating(inputs) or _ACTIVE.__dict__.get("busy"):
            return None
        # Eagerly, the ops the rewrite runs come back to this callback (TensorFlow guards
        # against that only while tracing): the flag leaves them alone.
        _ACTIVE.busy = True
        try:
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
        found.append(Site(guard.name, op_type, name, *user_frame(), _changed(outputs, new)))
        return returned

    def flush() -> None:
        while pending:
            record_identity(*pending.pop())

    return callback, flush


def producer_types(
    layer: keras.Layer, forward: Callable[[Any], Any], inputs: Any, op_types: Sequence[str]
) -> tuple[str, ...]:
    """The types of the ops that feed, inside ``layer``'s call, an op of ``op_types`` built
    there: its inputs' ops, theirs, and so on while they were built in the call, nearest
    first. ``forward(inputs)`` (a model that holds ``layer``, already built) is traced once
    in a ``tf.function``; nothing is computed. A guard of one of these ops treats a failure
    whose cause is upstream of the op that shows it (an ``exp`` whose terms all underflow
    shows as the 0 / 0 of the softmax's division)."""
    built: dict[str, Any] = {}
    callback = _recorder(built)
    saved = {m: layer.__dict__.get(m) for m in ("call", "forward")}
    for method in saved:
        original = getattr(layer, method, None)
        if callable(original):
            object.__setattr__(layer, method, _under(callback, lambda: None, original))
    try:
        tf.function(forward).get_concrete_function(inputs)
    finally:
        for method, value in saved.items():
            if value is not None:
                object.__setattr__(layer, method, value)
            elif method in layer.__dict__:
                object.__delattr__(layer, method)
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

    tf.function(hooked).get_concrete_function(*args)
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


def user_frame() -> tuple[str | None, int | None, int | None, int | None]:
    """The file, line and columns of the innermost frame outside TensorFlow, Keras, the
    standard library and this module: the user's code that built the op being rewritten.
    The columns are those of the frame's current instruction (``inspect.getframeinfo``'s
    ``positions``, Python 3.11 on): ``traceback.extract_stack`` leaves them out."""
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
        if positions is not None and positions.lineno != positions.end_lineno:
            col = end_col = None  # an expression over several lines: no span on one line
        return filename, frame.f_lineno, col, end_col
    return None, None, None, None
