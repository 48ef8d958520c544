"""One row of a check's report: a property of one variant, on one kind of input.

``setting`` is ``own data`` (the case's data set, batch by batch) or ``generated`` (graphs
Hypothesis draws within the case's bounds, ``stability.check.domain``, the smallest failing
batch kept). ``status`` is one of ``STATUSES``: ``pass``, ``fail``, ``not applicable`` (an
attention check on a model that exposes none, a float64 model's dtype agreement) or
``not declared`` (the case says the property does not hold for its model).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

PASS, FAIL, NOT_APPLICABLE, NOT_DECLARED = "pass", "fail", "not applicable", "not declared"
STATUSES = (PASS, FAIL, NOT_APPLICABLE, NOT_DECLARED)

OWN_DATA, GENERATED = "own data", "generated"
SETTINGS = (OWN_DATA, GENERATED)


@dataclass(frozen=True)
class CheckRow:
    """A property's verdict: ``detail`` says what broke (or what was tried), ``stage``,
    ``layer``, ``op`` and ``cause`` name a step failure as training names it, ``deviation``
    and ``tolerance`` an invariant's, ``graphs`` and ``nodes`` the counterexample's size,
    ``examples`` how many inputs were tried (until the first failure, for a failing one),
    ``counterexample`` the case file that holds the failing graphs, ``seconds`` the
    property's time."""

    case: str
    variant: str
    property: str
    setting: str
    status: str
    detail: str = ""
    stage: str | None = None
    layer: str | None = None
    op: str | None = None
    cause: str | None = None
    deviation: float | None = None
    tolerance: float | None = None
    graphs: int | None = None
    nodes: int | None = None
    examples: int = 0
    counterexample: str | None = None
    seconds: float = 0.0

    @property
    def failed(self) -> bool:
        return self.status == FAIL

    def as_dict(self) -> dict:
        return asdict(self)


#: The CSV's columns, in order (new ones are appended).
COLUMNS = tuple(CheckRow.__dataclass_fields__)
