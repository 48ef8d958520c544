"""A zoo bug's ground truth: where a public issue's numerical bug first shows, in the
harness's vocabulary, and what the maintainers did about it.

Each bug module of ``stability/zoo/bugs/`` defines ``BUG = ZooBug(...)`` beside its variant
and data; its case file ``<name>.toml`` names the module in ``plugins``.
"""

from __future__ import annotations

from dataclasses import dataclass

from stability.core.errors import StabilityError
from stability.core.failures import CAUSES, Stage
from stability.core.invariants import INVARIANTS
from stability.model.remedy import FIX_CLASSES

STAGES = tuple(stage.value for stage in Stage)


@dataclass(frozen=True)
class ZooBug:
    """One bug.

    - ``name``: the case file's stem and the bug's id in ``zoo.csv``.
    - ``source``: where it was reported, ``owner/repo#number`` (issue or pull request).
    - ``url``: the page.
    - ``summary``: the bug in one sentence.
    - ``variant``: the registered variant that reproduces it.
    - ``stage``: where the first non-finite (or, for a silent bug, wrong) value arises:
      one of ``core.failures.Stage``.
    - ``op``: a substring of the failing op the harness should name (``Exp``, ``Sqrt``...).
    - ``cause``: the cause in the harness's vocabulary (``core.failures.CAUSES``).
    - ``fix``: what the maintainers changed, in words.
    - ``fix_class``: the class of that change, one of ``model.remedy.FIX_CLASSES`` (an op
      guard, a stable reformulation, data cleaning, the dtype, an optimizer setting, an
      architecture change): the doctor's fix is right when it is of this class, or a
      guard at the bug's op.
    - ``silent``: the bug gives a wrong value without any NaN or Inf.
    - ``invariant``: for a silent bug, the graph invariant it breaks (one of
      ``INVARIANTS``), else empty.
    """

    name: str
    source: str
    url: str
    summary: str
    variant: str
    stage: str
    op: str
    cause: str
    fix: str
    fix_class: str = ""
    silent: bool = False
    invariant: str = ""

    def __post_init__(self) -> None:
        if self.stage not in STAGES:
            raise StabilityError(f"zoo bug {self.name}: stage {self.stage!r} not one of {STAGES}")
        if self.cause not in CAUSES:
            raise StabilityError(f"zoo bug {self.name}: cause {self.cause!r} not one of {CAUSES}")
        if self.fix_class not in FIX_CLASSES:
            raise StabilityError(
                f"zoo bug {self.name}: fix_class {self.fix_class!r} not one of {FIX_CLASSES}"
            )
        if self.invariant and self.invariant not in INVARIANTS:
            raise StabilityError(
                f"zoo bug {self.name}: invariant {self.invariant!r} not one of {INVARIANTS}"
            )
