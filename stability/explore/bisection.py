"""Bisection over a scale for the smallest one at which something fails.

``Bisection`` is driven from outside, one round at a time (``pending`` points to evaluate,
then ``record`` each), so a map can evaluate the rounds of many bisections in one batch of
runs; ``bisect`` drives one with a function, as the unit tests and the report's replay do.

The rule: evaluate both ends of the bracket ``[lo, hi]`` first. If ``lo`` already fails,
or ``hi`` does not, there is nothing to bisect. Otherwise ``lo`` passes and ``hi`` fails,
and each of ``steps`` rounds evaluates the geometric midpoint (the scale is searched in
log space: failures come at orders of magnitude, not at fixed differences) and keeps the
half that still goes from passing to failing. Midpoints are rounded to ``DIGITS``
significant digits, so that the points are readable and the same on every machine; a
midpoint that rounds onto an end stops the search early.

The search assumes one crossing from pass to fail; it finds *a* crossing in the bracket
when there are several.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

#: Significant digits of a bisection point.
DIGITS = 3

#: How a bisection ended.
FAILS_FROM = "fails from"
NEVER_FAILS = "no failure"
FAILS_AT_LOW = "fails at the smallest scale"


def round_scale(value: float, digits: int = DIGITS) -> float:
    """``value`` rounded to ``digits`` significant digits."""
    return float(f"{value:.{digits}g}")


def midpoint(lo: float, hi: float) -> float:
    """The geometric midpoint of ``lo`` and ``hi`` (> 0), rounded (``round_scale``)."""
    return round_scale(math.sqrt(lo) * math.sqrt(hi))  # no overflow of lo * hi


@dataclass(frozen=True)
class Boundary:
    """Where a bisection ended: ``kind`` is ``FAILS_FROM`` (passes at ``lo``, fails at
    ``hi``: the smallest scale seen failing), ``NEVER_FAILS`` (``hi`` passes) or
    ``FAILS_AT_LOW`` (``lo`` fails). ``points`` are the scales evaluated, in order."""

    kind: str
    lo: float
    hi: float
    points: tuple[float, ...]

    def words(self) -> str:
        """The boundary as the map report says it."""
        if self.kind == FAILS_FROM:
            return f"fails from {self.hi:g} [{self.lo:g}-{self.hi:g}]"
        if self.kind == NEVER_FAILS:
            return f"no failure up to the largest scale tried ({self.hi:g})"
        return f"fails already at the smallest scale tried ({self.lo:g})"


@dataclass
class Bisection:
    """One bisection over ``[lo, hi]`` with ``steps`` rounds after the two ends."""

    lo: float
    hi: float
    steps: int
    seen: dict[float, bool] = field(default_factory=dict)
    rounds: int = 0
    result: Boundary | None = None

    def pending(self) -> list[float]:
        """The scales to evaluate next (none once ``result`` is set)."""
        if self.result is not None:
            return []
        ends = [s for s in (self.lo, self.hi) if s not in self.seen]
        return ends or [midpoint(self.lo, self.hi)]

    def record(self, scale: float, fails: bool) -> None:
        """Record whether ``scale`` fails, then move on (or finish)."""
        self.seen[scale] = fails
        if scale not in (self.lo, self.hi):
            self.rounds += 1
            if fails:
                self.hi = scale
            else:
                self.lo = scale
        self._settle()

    def _settle(self) -> None:
        if self.lo not in self.seen or self.hi not in self.seen:
            return
        points = tuple(self.seen)
        if not self.rounds and self.seen[self.lo]:
            self.result = Boundary(FAILS_AT_LOW, self.lo, self.hi, points)
        elif not self.rounds and not self.seen[self.hi]:
            self.result = Boundary(NEVER_FAILS, self.lo, self.hi, points)
        elif self.rounds >= self.steps or midpoint(self.lo, self.hi) in (self.lo, self.hi):
            self.result = Boundary(FAILS_FROM, self.lo, self.hi, points)


def bisect(fails: Callable[[float], bool], lo: float, hi: float, steps: int) -> Boundary:
    """Bisect ``fails`` over ``[lo, hi]`` (see the module docstring)."""
    search = Bisection(lo, hi, steps)
    while search.result is None:
        for scale in search.pending():
            search.record(scale, fails(scale))
    return search.result
