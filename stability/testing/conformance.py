"""Conformance of any segment softmax: Hypothesis drives it to the dtype's limits.

``check_segment_softmax(fn)`` checks a segment softmax ``fn(logits, segment_ids,
num_segments)`` (``[num_edges]``, ``[num_edges]``, an int; returns ``[num_edges]`` in the
logits' dtype) on the inputs of ``stability.testing.inputs``: logits up to and past
where ``exp`` overflows and underflows, empty and single-edge segments, ties, duplicate
edges and, with ``mask=True`` (``fn(logits, segment_ids, num_segments, mask)``), masked
entries. Each property (``stability.testing.properties``) is its own Hypothesis search, so
each failure comes with its own shrunk counterexample, in every dtype asked for.

The tolerance is in ULPs of 1.0 and grows with the number of edges in the segment
(``stability.testing.tolerance``). The number of examples per property comes from the
Hypothesis profile (``stability.testing.profiles.conformance_examples``: 60 with ``ci``).

TensorFlow functions get gradients through ``tf.GradientTape``; NumPy functions have none
(those properties are "not applicable"); JAX and others come in as an ``Implementation``
(``stability.testing.adapters`` has the adapters). A run also measures the logits where
``fn`` stops being finite (``stability.testing.finite_range``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from hypothesis import HealthCheck, Verbosity, given, settings
from hypothesis.errors import Flaky

from stability.core.errors import StabilityError
from stability.testing.finite_range import finite_logits, span_text
from stability.testing.implementation import (
    ConformanceError,
    Implementation,
    as_implementation,
    check_output,
    probe,
)
from stability.testing.inputs import DTYPES, SoftmaxInput, softmax_inputs
from stability.testing.paragraph import describe_input, error_text
from stability.testing.profiles import conformance_examples, profile_name
from stability.testing.properties import CHECKS, GRADIENT_PROPERTIES, PROPERTIES
from stability.testing.tolerance import DEFAULT_ULPS, tolerance_text


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
    (default: $STABILITY_HYPOTHESIS_PROFILE, else ``"ci"``; ``stability.testing.profiles``).
    ``ConformanceError`` when ``fn`` cannot be checked at all (it raises on a plain input,
    or returns the wrong shape or dtype)."""
    profile = profile_name(profile)
    examples = conformance_examples(profile)
    dtypes = (dtypes,) if isinstance(dtypes, str) else tuple(dtypes)
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
            results.append(_check_property(impl, dtype, prop, examples, ulps))
    return ConformanceReport(impl.name, profile, examples, ulps, tuple(results), spans)


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
    plain = probe(dtype, impl.takes_mask)
    try:
        check_output(plain, impl.forward(plain), "output")
        if impl.gradient is not None:
            gradient = impl.gradient(plain)
            if gradient is not None:
                check_output(plain, gradient, "gradient")
    except ConformanceError as exc:
        raise ConformanceError(f"{impl.name} {exc} ({describe_input(plain)})") from None
    except Exception as exc:
        raise ConformanceError(
            f"{impl.name} raised {error_text(exc)} on a plain {dtype} input "
            f"({describe_input(plain)})"
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
    if prop in GRADIENT_PROPERTIES and impl.gradient is None:
        return PropertyResult(dtype, prop, "not applicable")
    check = CHECKS[prop]

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
