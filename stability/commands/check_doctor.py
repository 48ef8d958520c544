"""Where the check and the doctor meet: the doctor of broken invariants
(``stability.doctor.invariant``) proves each repair with the check (``verify``), for
``check --doctor`` and for the zoo's bugs that training does not show failing. The two
features never import each other; this top layer hands one to the other."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from stability.check.outcome import FAIL, PASS, SETTINGS
from stability.check.properties import PROPERTIES
from stability.check.run import DEFAULT_EXAMPLES, check_bug, check_variant
from stability.doctor.invariant import InvariantDoctor, Repair, doctor_invariants
from stability.sweep.cases import Case, load_case


def verify(
    case: Case,
    variant: str,
    properties: Sequence[str],
    own_data_only: bool = False,
    examples: int = DEFAULT_EXAMPLES,
) -> dict[str, str]:
    """The check of ``variant`` on ``case`` for ``properties`` (``doctor.invariant.Verify``):
    for each it could check, the first thing that broke (``"<setting>: <detail>"``), or ""
    where it held on the case's data (and, unless ``own_data_only``, on every generated
    batch)."""
    settings = SETTINGS[:1] if own_data_only else SETTINGS
    found: dict[str, str] = {}
    rows = check_variant(
        case, variant, examples=examples, properties=properties, settings_=settings
    )
    for row in rows:
        if row.status not in (PASS, FAIL):
            continue
        found.setdefault(row.property, "")
        if row.status == FAIL and not found[row.property]:
            found[row.property] = f"{row.setting}: {row.detail}"
    return found


def doctor_case(
    case: Case,
    variant: str,
    examples: int = DEFAULT_EXAMPLES,
    own_data_only: bool = False,
    properties: Sequence[str] = PROPERTIES,
    on_repair: Callable[[Repair], None] | None = None,
) -> InvariantDoctor:
    """The doctor of ``variant``'s broken ``properties`` on ``case`` (on the case's own data
    only, with ``own_data_only``), each repair passed to ``on_repair`` once checked."""

    def check(case: Case, variant: str, names: Sequence[str], own: bool) -> dict[str, str]:
        return verify(case, variant, names, own or own_data_only, examples)

    return doctor_invariants(case, variant, check, properties, on_repair)


def check_and_repair(case_path: str, variant: str, repair: bool = False) -> dict:
    """The zoo's check of a bug (``check.run.check_bug``) and, with ``repair`` (a bug that
    training does not show failing), the doctor of what the check finds broken: its
    recommended repair, its class, its fix as code and every repair's verdict. A plain dict,
    picklable across the zoo's worker processes."""
    scored = check_bug(case_path, variant)
    if not repair or not any(scored[s]["detected"] for s in scored):
        return scored
    try:
        doctor = doctor_case(load_case(case_path), variant)
    except Exception as exc:  # the bug's model: a doctor that cannot start scores no fix
        first = (str(exc).strip().splitlines() or [""])[0]
        scored["repair"] = {"recommended": "", "verdicts": f"error: {type(exc).__name__}: {first}"}
        return scored
    best = doctor.recommended()
    scored["repair"] = {
        "broken": sorted(doctor.broken),
        "recommended": best.remedy.name if best else "",
        "layer": best.layer if best else "",
        "fix_class": best.remedy.fix_class if best else "",
        "code": doctor.code_fix_text(best),
        "verdicts": ";".join(f"{r.name}:{r.verdict}" for r in doctor.repairs if r.case),
    }
    return scored
