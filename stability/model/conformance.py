"""Conformance of any segment softmax: Hypothesis drives it to the dtype's limits.

``check_segment_softmax(fn)`` checks a segment softmax ``fn(logits, segment_ids,
num_segments)`` (``[num_edges]``, ``[num_edges]``, an int; returns ``[num_edges]`` in the
logits' dtype) on the inputs of ``stability.model.softmax_inputs``: logits up to and past
where ``exp`` overflows and underflows, empty and single-edge segments, ties, duplicate
edges and, with ``mask=True`` (``fn(logits, segment_ids, num_segments, mask)``), masked
entries. Each property is its own Hypothesis search, so each failure comes with its own
shrunk counterexample. The properties, in every dtype asked for:

- ``finite``: every output is finite;
- ``in_unit_interval``: every output lies in [0, 1];
- ``sums_to_one``: each segment with an edge taking part sums to 1 within
  ``(ulps + 2n) * eps``;
- ``matches_reference``: each output is within ``(ulps + n) * eps`` of the reference;
- ``gradient_finite`` and ``gradient_matches``: the gradient of ``sum(softmax * m)``
  (``m`` drawn in [-1, 1]) is finite and within ``2 * (ulps + 2n) * eps`` of the reference.

The tolerance is in ULPs of 1.0 (``eps``, the dtype's machine epsilon, since every value
is at most 1) and grows with ``n``, the number of edges in the segment, because a sum of
``n`` terms may round ``n`` times; ``ulps`` defaults to 8. The reference is the max-shifted
softmax computed in ``np.longdouble`` from the very logits ``fn`` saw.

TensorFlow functions get gradients through ``tf.GradientTape``; NumPy functions have none
(those properties are "not applicable"); JAX and others come in as an ``Implementation``
(``stability.model.conformance_adapters`` has the adapters). A run also measures the
logits where ``fn`` stops being finite: ``[x, 0]`` in one segment for the upper end, a
single edge ``[x]`` for the lower one.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from hypothesis import HealthCheck, Verbosity, given, settings
from hypothesis.errors import Flaky

from stability.core.errors import StabilityError
from stability.model.softmax_inputs import (
    DTYPES,
    SoftmaxInput,
    reference_gradient,
    reference_softmax,
    softmax_inputs,
)

PROPERTIES = (
    "finite",
    "in_unit_interval",
    "sums_to_one",
    "matches_reference",
    "gradient_finite",
    "gradient_matches",
)
_GRADIENT_PROPERTIES = ("gradient_finite", "gradient_matches")

#: Examples per property. ``ci`` keeps one implementation in one dtype within seconds;
#: ``thorough`` is for a long local run. Both derandomized: same examples every run.
PROFILES = {"ci": 60, "thorough": 10_000}
#: The tolerance's base, in ULPs of 1.0 (see the module docstring).
DEFAULT_ULPS = 8


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
            _check_output(x, out, "output")
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


#: A small input every segment softmax must handle: two edges into segment 0, one into 2,
#: segment 1 empty.
def _probe(dtype: str, mask: bool) -> SoftmaxInput:
    kind = np.dtype(dtype).type
    return SoftmaxInput(
        logits=np.array([0.5, -0.25, 1.0], kind),
        segment_ids=np.array([0, 0, 2], np.int32),
        num_segments=3,
        mask=np.array([True, True, True]) if mask else None,
        messages=np.array([1.0, -0.5, 0.25], kind),
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

    probe = _probe("float32", mask)
    try:
        if isinstance(fn(*_arguments(probe, tf.constant)), tf.Tensor):
            return from_tensorflow(fn, name=name, mask=mask)
    except Exception:  # not a TensorFlow function: try it on NumPy arrays next
        pass
    try:
        out = fn(*_arguments(probe, np.asarray))
    except Exception as exc:
        raise ConformanceError(
            f"{_name_of(fn, name)} raised {_error(exc)} on a plain input ({_describe_input(probe)})"
        ) from None
    if not isinstance(out, np.ndarray | np.generic):
        raise ConformanceError(
            f"{_name_of(fn, name)} returned {type(out).__name__}, neither a tf.Tensor nor a "
            "numpy array; wrap other frameworks in an Implementation "
            "(stability.model.conformance_adapters)"
        )
    return from_numpy(fn, name=name, mask=mask)


def _error(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return f"{type(exc).__name__}: {text[:300]}" if text else type(exc).__name__


def _check_output(x: SoftmaxInput, out: Any, what: str) -> np.ndarray:
    """``out`` as a NumPy array; ``ConformanceError`` if its shape or dtype is not ``x``'s."""
    array = np.asarray(out.numpy() if hasattr(out, "numpy") else out)
    if array.shape != x.logits.shape:
        raise ConformanceError(
            f"returned {what} of shape {list(array.shape)} for logits of shape "
            f"{list(x.logits.shape)}; it must be [num_edges], the logits' shape"
        )
    if array.dtype != x.logits.dtype:
        raise ConformanceError(
            f"returned {what} of dtype {array.dtype} for {x.dtype} logits; it must keep the "
            "logits' dtype"
        )
    return array


@dataclass(frozen=True)
class PropertyResult:
    """The verdict on one property in one dtype: ``pass``, ``fail`` or ``not applicable``."""

    dtype: str
    name: str
    status: str
    counterexample: str = ""  # one paragraph, for a failure


@dataclass(frozen=True)
class ConformanceReport:
    """Every property's verdict for one implementation, and where it stays finite."""

    implementation: str
    profile: str
    examples: int  # per property and dtype
    ulps: int
    results: tuple[PropertyResult, ...]
    #: dtype -> (lowest, highest) logit for which the output stays finite; None if it is
    #: not finite even at 0.
    finite_logits: dict[str, tuple[float, float] | None] = field(default_factory=dict)

    @property
    def passed(self) -> bool:
        return all(r.status != "fail" for r in self.results)

    @property
    def failures(self) -> list[PropertyResult]:
        return [r for r in self.results if r.status == "fail"]

    def tolerance(self) -> str:
        return tolerance_text(self.ulps)

    def __str__(self) -> str:
        lines = [
            f"segment softmax conformance of {self.implementation} (profile {self.profile}, "
            f"{self.examples} examples per property): "
            + ("conforms" if self.passed else f"{len(self.failures)} properties fail"),
            f"tolerance: {self.tolerance()}",
        ]
        for dtype, span in self.finite_logits.items():
            lines.append(f"{dtype}: finite for logits in {span_text(span, dtype)}")
        for r in self.results:
            lines.append(f"{r.dtype:<8} {r.name:<18} {r.status}")
        lines += [
            f"\n{self.implementation} in {r.dtype} fails {r.name}: {r.counterexample}"
            for r in self.failures
        ]
        return "\n".join(lines)


def tolerance_text(ulps: int) -> str:
    """The stated tolerance, for reports."""
    return (
        f"values within ({ulps} + n) eps of the longdouble reference, segment sums within "
        f"({ulps} + 2n) eps of 1, gradients within 2 ({ulps} + 2n) eps; eps is the dtype's "
        "machine epsilon, n the number of edges in the segment"
    )


def span_text(span: tuple[float, float] | None, dtype: str) -> str:
    """``[low, high]``, each the shortest text that reads back as the same ``dtype`` value."""
    if span is None:
        return "no logit (not even 0)"
    kind = np.dtype(dtype).type
    return f"[{kind(span[0])!s}, {kind(span[1])!s}]"  # str: the shortest text for the dtype


def check_segment_softmax(
    fn: Callable[..., Any] | Implementation,
    *,
    dtypes: Sequence[str] = DTYPES,
    mask: bool = False,
    profile: str | None = None,
    ulps: int = DEFAULT_ULPS,
    name: str | None = None,
) -> ConformanceReport:
    """Check ``fn`` in each of ``dtypes`` and return the report; never raises on a failed
    property (``report.passed`` says). ``profile`` is ``"ci"`` or ``"thorough"``
    (default: $STABILITY_HYPOTHESIS_PROFILE, else ``"ci"``). ``ConformanceError`` when
    ``fn`` cannot be checked at all (it raises on a plain input, or returns the wrong shape
    or dtype)."""
    profile = profile or os.environ.get("STABILITY_HYPOTHESIS_PROFILE", "ci")
    dtypes = (dtypes,) if isinstance(dtypes, str) else tuple(dtypes)
    if profile not in PROFILES:
        raise StabilityError(f"profile {profile!r} is unknown; known: {', '.join(PROFILES)}")
    for dtype in dtypes:
        if dtype not in DTYPES:
            raise StabilityError(f"dtype {dtype!r} is not one of {', '.join(DTYPES)}")
    impl = as_implementation(fn, name=name, mask=mask)
    mask = mask or impl.takes_mask
    # Derandomized, every property's search draws the same inputs first: compute each once.
    impl = Implementation(
        impl.name,
        _memoized(impl.forward),
        None if impl.gradient is None else _memoized(impl.gradient),
        mask,
    )
    results, spans = [], {}
    for dtype in dtypes:
        _check_probe(impl, dtype)
        spans[dtype] = finite_logits(impl, dtype)
        for prop in PROPERTIES:
            results.append(_check_property(impl, dtype, prop, PROFILES[profile], ulps))
    return ConformanceReport(impl.name, profile, PROFILES[profile], ulps, tuple(results), spans)


def assert_segment_softmax_conforms(
    fn: Callable[..., Any] | Implementation, **options: Any
) -> ConformanceReport:
    """``check_segment_softmax(fn, **options)``, raising ``AssertionError`` with every
    failure's counterexample when a property fails; for a test suite."""
    report = check_segment_softmax(fn, **options)
    if not report.passed:
        raise AssertionError(str(report))
    return report


def _memoized(call: Callable[[SoftmaxInput], Any]) -> Callable[[SoftmaxInput], Any]:
    """``call``, computed once per distinct input (its result or the exception it raised)."""
    seen: dict[tuple, tuple[bool, Any]] = {}

    def once(x: SoftmaxInput) -> Any:
        mask = None if x.mask is None else x.mask.tobytes()
        key = (x.logits.tobytes(), x.dtype, x.segment_ids.tobytes(), x.num_segments, mask)
        key += (x.messages.tobytes(),)
        if key not in seen:
            try:
                seen[key] = (True, call(x))
            except Exception as exc:
                seen[key] = (False, exc)
        ok, value = seen[key]
        if not ok:
            raise value
        return value

    return once


def _check_probe(impl: Implementation, dtype: str) -> None:
    """``ConformanceError`` unless ``impl`` runs on the probe input in ``dtype``."""
    probe = _probe(dtype, impl.takes_mask)
    try:
        _check_output(probe, impl.forward(probe), "output")
        if impl.gradient is not None:
            gradient = impl.gradient(probe)
            if gradient is not None:
                _check_output(probe, gradient, "gradient")
    except ConformanceError as exc:
        raise ConformanceError(f"{impl.name} {exc} ({_describe_input(probe)})") from None
    except Exception as exc:
        raise ConformanceError(
            f"{impl.name} raised {_error(exc)} on a plain {dtype} input ({_describe_input(probe)})"
        ) from None


def _settings(examples: int) -> settings:
    return settings(
        max_examples=examples,
        derandomize=True,  # the same examples every run: a report is reproducible
        database=None,
        deadline=None,
        report_multiple_bugs=False,  # one shrunk counterexample per property
        suppress_health_check=list(HealthCheck),
        verbosity=Verbosity.quiet,
        print_blob=False,
    )


def _check_property(
    impl: Implementation, dtype: str, prop: str, examples: int, ulps: int
) -> PropertyResult:
    if prop in _GRADIENT_PROPERTIES and impl.gradient is None:
        return PropertyResult(dtype, prop, "not applicable")
    check = _CHECKS[prop]

    prefix = f"{impl.name} in {dtype} fails {prop}: "

    @_settings(examples)
    @given(x=softmax_inputs(dtype, mask=impl.takes_mask))
    def search(x: SoftmaxInput) -> None:
        problem = check(impl, x, ulps)
        # Hypothesis shrinks, then raises this assertion again for the smallest input,
        # so the message is the shrunk counterexample's paragraph.
        assert problem is None, prefix + str(problem)

    try:
        search()
    except AssertionError as failure:
        paragraph = str(failure).split("\n")[0].removeprefix(prefix)
        return PropertyResult(dtype, prop, "fail", paragraph)
    except Flaky as flaky:  # a softmax whose verdict changes on the same input
        text = f"it is not deterministic: the same input passed once and failed once ({flaky})"
        return PropertyResult(dtype, prop, "fail", " ".join(text.split()))
    return PropertyResult(dtype, prop, "pass")


# --- the properties: each returns None or the paragraph describing the failure ----------


def _outputs(impl: Implementation, x: SoftmaxInput) -> tuple[np.ndarray | None, str | None]:
    try:
        return _check_output(x, impl.forward(x), "output"), None
    except Exception as exc:
        return None, _raised(exc, x)


def _gradient(impl: Implementation, x: SoftmaxInput) -> tuple[np.ndarray | None, str | None]:
    assert impl.gradient is not None
    try:
        gradient = impl.gradient(x)
        if gradient is None:
            return None, f"it has no gradient. {_describe_input(x)}."
        return _check_output(x, gradient, "gradient"), None
    except Exception as exc:
        return None, _raised(exc, x)


def _raised(exc: BaseException, x: SoftmaxInput) -> str:
    return f"it raised {_error(exc)}. {_describe_input(x)}."


def _sizes(x: SoftmaxInput) -> np.ndarray:
    """[num_edges]: the number of edges in each edge's segment."""
    return np.bincount(x.segment_ids, minlength=x.num_segments)[x.segment_ids]


def _finite(impl: Implementation, x: SoftmaxInput, ulps: int) -> str | None:
    out, problem = _outputs(impl, x)
    if problem:
        return problem
    return _first_bad(x, ~np.isfinite(out), "a non-finite output", out, reference_softmax(x))


def _in_unit_interval(impl: Implementation, x: SoftmaxInput, ulps: int) -> str | None:
    out, problem = _outputs(impl, x)
    if problem:
        return problem
    inside = (out >= 0) & (out <= 1)
    return _first_bad(x, ~inside, "an output outside [0, 1]", out, reference_softmax(x))


def _sums_to_one(impl: Implementation, x: SoftmaxInput, ulps: int) -> str | None:
    out, problem = _outputs(impl, x)
    if problem:
        return problem
    part = x.taking_part()
    sums = np.zeros(x.num_segments)
    np.add.at(sums, x.segment_ids[part], out[part].astype(np.float64))
    counts = np.bincount(x.segment_ids[part], minlength=x.num_segments)
    eps = float(np.finfo(x.logits.dtype).eps)
    off = ~(np.abs(sums - 1) <= (ulps + 2 * counts) * eps) & (counts > 0)
    if not off.any():
        return None
    segment = int(np.argmax(off))
    edge = int(np.argmax((x.segment_ids == segment) & part))
    what = f"a segment summing to {float(sums[segment])!r}"
    return _first_bad(x, np.arange(len(out)) == edge, what, out, reference_softmax(x))


def _matches_reference(impl: Implementation, x: SoftmaxInput, ulps: int) -> str | None:
    out, problem = _outputs(impl, x)
    if problem:
        return problem
    expected = reference_softmax(x)
    eps = float(np.finfo(x.logits.dtype).eps)
    close = np.abs(out.astype(np.float64) - expected) <= (ulps + _sizes(x)) * eps
    return _first_bad(x, ~close, "an output off the reference", out, expected)


def _gradient_finite(impl: Implementation, x: SoftmaxInput, ulps: int) -> str | None:
    gradient, problem = _gradient(impl, x)
    if problem:
        return problem
    bad = ~np.isfinite(gradient)
    return _first_bad(x, bad, "a non-finite gradient", gradient, reference_gradient(x), True)


def _gradient_matches(impl: Implementation, x: SoftmaxInput, ulps: int) -> str | None:
    gradient, problem = _gradient(impl, x)
    if problem:
        return problem
    expected = reference_gradient(x)
    eps = float(np.finfo(x.logits.dtype).eps)
    tolerance = 2 * (ulps + 2 * _sizes(x)) * eps
    close = np.abs(gradient.astype(np.float64) - expected) <= tolerance
    return _first_bad(x, ~close, "a gradient off the reference", gradient, expected, True)


_CHECKS: dict[str, Callable[[Implementation, SoftmaxInput, int], str | None]] = {
    "finite": _finite,
    "in_unit_interval": _in_unit_interval,
    "sums_to_one": _sums_to_one,
    "matches_reference": _matches_reference,
    "gradient_finite": _gradient_finite,
    "gradient_matches": _gradient_matches,
}


# --- the paragraph -------------------------------------------------------------------------


def _values(array: np.ndarray) -> str:
    return "[" + ", ".join(str(v) for v in array) + "]"


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"


def _describe_input(x: SoftmaxInput) -> str:
    text = (
        f"Input: {_count(len(x.logits), 'edge')} in {_count(x.num_segments, 'segment')}, "
        f"{x.dtype} logits "
        f"{_values(x.logits)}, segment_ids {_values(x.segment_ids)}"
    )
    return text if x.mask is None else f"{text}, mask {_values(x.mask)}"


def _first_bad(
    x: SoftmaxInput,
    bad: np.ndarray,
    what: str,
    actual: np.ndarray,
    expected: np.ndarray,
    gradient: bool = False,
) -> str | None:
    """None if no edge is ``bad``, else the paragraph about the first bad edge's segment."""
    if not bad.any():
        return None
    edge = int(np.argmax(bad))
    segment = int(x.segment_ids[edge])
    members = np.flatnonzero(x.segment_ids == segment)
    kind = "gradient" if gradient else "softmax"
    text = (
        f"{what} at edge {edge}. {_describe_input(x)}. Segment {segment} (edges "
        f"{_values(members)}) has logits {_values(x.logits[members])}"
    )
    if x.mask is not None:
        text += f", mask {_values(x.mask[members])}"
    if gradient:
        text += f", messages {_values(x.messages[members])}"
    return (
        f"{text}; expected {kind} {_values(expected[members])}, actual {_values(actual[members])}."
    )


# --- where the output stays finite ---------------------------------------------------------


def _finite_at(impl: Implementation, x: SoftmaxInput) -> bool:
    out, problem = _outputs(impl, x)
    return problem is None and bool(np.isfinite(out).all())


def _single(dtype: str, logits: list[Any], mask: bool) -> SoftmaxInput:
    kind = np.dtype(dtype).type
    n = len(logits)
    return SoftmaxInput(
        np.array(logits, kind),
        np.zeros(n, np.int32),
        1,
        np.ones(n, bool) if mask else None,
        np.ones(n, kind),
    )


def _last_finite(dtype: str, ok: Callable[[Any], bool]) -> float:
    """The largest representable ``v >= 0`` with ``ok(v)``, by bisection on the bit patterns
    (ordered like the values for non-negative floats); assumes ``ok(0)``."""
    kind = np.dtype(dtype).type
    bits = np.dtype(f"u{np.dtype(dtype).itemsize}").type
    low, high = 0, int(np.array(np.finfo(kind).max, kind).view(bits))
    if ok(np.array(high, bits).view(kind)):
        return float(np.finfo(kind).max)
    while high - low > 1:  # ok at low, not ok at high
        mid = (low + high) // 2
        if ok(np.array(mid, bits).view(kind)):
            low = mid
        else:
            high = mid
    return float(np.array(low, bits).view(kind))


def finite_logits(impl: Implementation, dtype: str) -> tuple[float, float] | None:
    """(lowest, highest) logit for which ``impl`` stays finite: the highest ``x`` with
    ``[x, 0]`` in one segment finite, the lowest with a single edge ``[x]`` finite; None if
    neither is finite at 0."""
    mask = impl.takes_mask

    def over(v: Any) -> bool:
        return _finite_at(impl, _single(dtype, [v, 0], mask))

    def under(v: Any) -> bool:
        return _finite_at(impl, _single(dtype, [-v], mask))

    if not (over(0) and under(0)):
        return None
    return -_last_finite(dtype, under), _last_finite(dtype, over)
