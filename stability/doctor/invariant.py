"""The doctor of a broken invariant: a model that never makes a NaN, yet breaks a property
``stability check`` proves (a graph's prediction depends on the graphs batched with it,
float32 disagrees with float64), repaired by the remedies that change the model and proved
by checking it again.

No training runs here: the finding is the check's, and so is the proof. The doctor is given
the check (``Verify``), not importing it (a feature never imports another); the command
line hands it over, as it hands the doctor to the zoo.

1. **The finding**: the properties the check finds broken on the case's own data or on
   generated graphs, and those it finds holding.
2. **The repairs**: every op guard at every layer that builds one of its ops (the deepest
   such layers; instances of one class are one site, as a guard's fix is a line of that
   class), and every other remedy that changes what the model computes (its formulas and
   architecture). Remedies that act through training (optimizer settings) or change what
   the check proves the model on (the data, the dtype) cannot be proved without training,
   and are not tried: the report says so.
3. **The verdict**: ``fixes`` when the check, run again on the remedied model, finds every
   broken property holding and every property that held still holding; ``holds on this
   data`` when the broken properties hold on the case's own data (which broke them) but
   generated graphs still break one; else ``does not help``; ``not applicable`` when the
   remedy cannot act on the model (it builds no such op, or the guarded model fails on a
   batch).
4. **The recommendation**: the most local fix first (``LOCALITY``), then one change before
   a chain, then the name; an op guard's fix is printed as the user's line before and after.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from stability.compat.keras_layers import nested_layers
from stability.core.errors import RemedyError, StabilityError
from stability.doctor.code_fix import CodeFix, fixes_text, remedy_fixes
from stability.doctor.remedies import case_for
from stability.doctor.run import LOCALITY, applied_target, trial_target
from stability.model.op_guard import Site, guard_named
from stability.model.remedies import failing_op_producers, recipe_sites
from stability.model.remedy import OP_GUARD, REMEDY_MARK, Remedy, at_layer, list_remedies
from stability.report.verdicts import DOES_NOT_HELP, FIXES, HOLDS_ON_THIS_DATA, NOT_APPLICABLE
from stability.sweep.cases import Case

#: ``verify(case, variant, properties, own_data_only)``: the check of ``variant`` on
#: ``case`` for ``properties`` (on the case's own data only, or on generated graphs too);
#: for each it could check (not "not applicable" or "not declared"), what broke first
#: ("" where it held on every input).
Verify = Callable[[Case, str, Sequence[str], bool], Mapping[str, str]]

#: The classes of fix a check can prove: changes of what the model computes.
PROVABLE = (OP_GUARD, "stable reformulation", "architecture change")

#: Why the others are not tried, by class.
UNPROVABLE = {
    "optimizer setting": "it acts through training, which the check does not run",
    "data cleaning": "it changes the data the check proves the model on",
    "dtype": "it changes the dtype the check compares with float64",
}


@dataclass
class Repair:
    """One remedy on the broken invariants: the layer it acts in (an op guard's), the
    remedied variant (None when it cannot apply, ``reason`` says why), what the check found
    broken after it, and for an op guard the ops it rewrote."""

    remedy: Remedy
    layer: str | None
    case: Case | None
    reason: str = ""
    broken: dict[str, str] | None = None
    sites: list[Site] = field(default_factory=list)
    #: Whether the broken properties held on the case's own data (which broke them).
    holds_own_data: bool = False

    @property
    def name(self) -> str:
        """The remedy as the remedied variant names it (``guard_sqrt@layer``)."""
        return at_layer(self.remedy.name, self.layer)

    @property
    def variant(self) -> str | None:
        return self.case.variants[0] if self.case is not None else None

    @property
    def verdict(self) -> str:
        if self.case is None or self.broken is None:
            return NOT_APPLICABLE
        if not self.broken:
            return FIXES
        return HOLDS_ON_THIS_DATA if self.holds_own_data else DOES_NOT_HELP


@dataclass
class InvariantDoctor:
    """The doctor's work on one variant: what the check found broken (property -> what
    broke) and holding, and every repair tried."""

    case: Case
    variant: str
    broken: dict[str, str]
    holding: tuple[str, ...]
    repairs: list[Repair] = field(default_factory=list)
    #: The broken properties that the case's own data breaks (the rest only generated graphs).
    broken_own_data: tuple[str, ...] = ()

    def fixes(self) -> list[Repair]:
        """The repairs that fix, the recommended first (module docstring, 4)."""
        fixed = [r for r in self.repairs if r.verdict == FIXES]
        return sorted(fixed, key=_recommendation)

    def recommended(self) -> Repair | None:
        fixes = self.fixes()
        return fixes[0] if fixes else None

    def code_fixes(self, repair: Repair | None) -> list[CodeFix]:
        """The lines of the user's code an op guard's repair rewrites, before and after."""
        if repair is None:
            return []
        return remedy_fixes(repair.remedy, repair.sites, self.case.dtype)

    def code_fix_text(self, repair: Repair | None) -> str:
        """``file:line: before => after`` for each line ``code_fixes`` gives, `` | ``-joined."""
        return fixes_text(self.code_fixes(repair))


def _recommendation(repair: Repair) -> tuple:
    return (
        LOCALITY.index(repair.remedy.fix_class),
        repair.remedy.name.count(REMEDY_MARK),
        repair.name,
    )


def doctor_invariants(
    case: Case,
    variant: str,
    verify: Verify,
    properties: Sequence[str],
    on_repair: Callable[[Repair], None] | None = None,
) -> InvariantDoctor:
    """Check ``variant`` on ``case`` for ``properties``; where some are broken, try every
    provable remedy (module docstring) and check each remedied variant again. The case's
    first run's settings are the check's (``case`` as given)."""
    found = dict(verify(case, variant, properties, False))
    broken = {name: what for name, what in found.items() if what}
    holding = tuple(name for name, what in found.items() if not what)
    doctor = InvariantDoctor(case, variant, broken, holding)
    if not broken:
        return doctor
    own = verify(case, variant, tuple(broken), True)
    doctor.broken_own_data = tuple(name for name, what in own.items() if what)
    for repair in planned_repairs(case, variant):
        if repair.case is not None:
            _prove(repair, doctor, verify)
        doctor.repairs.append(repair)
        if on_repair is not None:
            on_repair(repair)
    return doctor


def _prove(repair: Repair, doctor: InvariantDoctor, verify: Verify) -> None:
    """Check the remedied variant, cheapest first, stopping at the first property broken:
    the broken ones on the case's own data, then on generated graphs too, then those that
    held."""
    assert repair.case is not None and repair.variant is not None
    case, variant = repair.case, repair.variant
    try:
        still: dict[str, str] = {}
        if doctor.broken_own_data:
            own = verify(case, variant, doctor.broken_own_data, True)
            still = {name: what for name, what in own.items() if what}
            repair.holds_own_data = not still
        if not still:
            after = verify(case, variant, tuple(doctor.broken), False)
            still = {name: what for name, what in after.items() if what}
        if not still and doctor.holding:
            again = verify(case, variant, doctor.holding, False)
            still = {f"{name} (held before)": what for name, what in again.items() if what}
            repair.holds_own_data = False  # it breaks what held: no fix anywhere
    except Exception as exc:  # the user's model, remedied: any error is the repair's
        first = (str(exc).strip().splitlines() or [""])[0]
        repair.case, repair.reason = None, f"the remedied model cannot be checked: {first}"
        return
    repair.broken = still


def planned_repairs(case: Case, variant: str) -> list[Repair]:
    """Every remedy's repair of ``variant``: op guards at the layers that build their ops,
    the other provable remedies on the whole model, and the rest with why they are not
    tried."""
    layers = _layer_ops(case, variant)
    repairs: list[Repair] = []
    for remedy in list_remedies():
        if remedy.fix_class not in PROVABLE or remedy.model is None:
            reason = UNPROVABLE.get(remedy.fix_class, "it changes no model")
            repairs.append(Repair(remedy, None, None, reason))
        elif remedy.is_op_guard:
            repairs += _guard_repairs(remedy, case, variant, layers)
        else:
            repairs.append(_built(remedy, case, variant, None, ()))
    return repairs


def _guard_repairs(
    remedy: Remedy, case: Case, variant: str, layers: Mapping[str, tuple[str, ...]]
) -> list[Repair]:
    guard = guard_named(remedy.name)
    sites = [name for name, ops in layers.items() if set(guard.op_types) & set(ops)]
    if not sites:
        ops = " or ".join(guard.op_types)
        return [Repair(remedy, None, None, f"no layer of the model builds {ops}")]
    return [_built(remedy, case, variant, layer, guard.op_types) for layer in sites]


def _built(
    remedy: Remedy, case: Case, variant: str, layer: str | None, ops: Sequence[str]
) -> Repair:
    """The repair with its remedied case built and its predicate asked (``applied_target``:
    an op guard must rewrite an op on a batch); ``not applicable`` with why otherwise."""
    name = f"{case.name}__{at_layer(remedy.name, layer)}"
    try:
        remedied = case_for(remedy, case, variant, layer, name)
        target = applied_target(remedy, case, remedied, tuple(ops))
    except StabilityError as exc:  # RemedyError included: the reason it cannot apply
        return Repair(remedy, layer, None, str(exc))
    sites = recipe_sites(target.recipe()) if remedy.is_op_guard else []
    return Repair(remedy, layer, remedied, sites=sites)


def _layer_ops(case: Case, variant: str) -> dict[str, tuple[str, ...]]:
    """The op types each layer of the variant's model builds in its own call, for the
    deepest layers that build each (a layer's call also builds its sublayers' ops; the guard
    goes where the op is written), one layer per class (``_same_call``: a guard of one
    guards every instance). Layers by name, in the model's order."""
    target = trial_target(replace(case, variants=(variant,)))
    try:
        model = target.recipe().model
    except RemedyError as exc:
        raise StabilityError(f"variant {variant!r} cannot be built: {exc}") from None
    every = [model, *nested_layers(model)]
    built = {id(layer): set(failing_op_producers(target, layer.name, ())) for layer in every}
    own: dict[str, tuple[str, ...]] = {}
    classes: set[Any] = set()
    for layer in every:
        inner = set().union(*(built[id(sub)] for sub in nested_layers(layer)))
        mine = built[id(layer)] - inner
        call = getattr(type(layer), "call", None)
        if mine and call not in classes:
            classes.add(call)
            own[layer.name] = tuple(sorted(mine))
    return own


def invariant_markdown(doctors: Sequence[InvariantDoctor], source: str, command: str) -> str:
    """The doctor's report on the broken invariants of each variant: what broke, the
    recommended fix (as code for an op guard) and the command that checks it, and every
    repair's verdict. Every sentence is read off the doctors' repairs."""
    lines = [
        f"# The doctor of broken invariants: case `{doctors[0].case.name}`" if doctors else "",
        "",
        f"Written by `{command}`: each variant that breaks a property the check proves, with "
        "every remedy that changes the model tried and checked again, without training "
        "([docs/doctor.md](../docs/doctor.md#invariants-a-model-breaks-without-a-nan)).",
        "",
    ]
    for doctor in doctors:
        lines += _variant_section(doctor, source)
    return "\n".join(lines).rstrip() + "\n"


def _variant_section(doctor: InvariantDoctor, source: str) -> list[str]:
    lines = [f"## `{doctor.variant}`", ""]
    if not doctor.broken:
        return [*lines, "Every property the check could check holds: nothing to doctor.", ""]
    lines += [f"- breaks `{name}`: {what}" for name, what in doctor.broken.items()]
    best = doctor.recommended()
    tried = [r for r in doctor.repairs if r.case is not None]
    verdicts = [r.verdict for r in tried]
    counts = {v: verdicts.count(v) for v in dict.fromkeys(verdicts)}
    lines += [
        "",
        f"{len(tried)} repairs checked: "
        + (", ".join(f"{n} {v}" for v, n in counts.items()) or "none applies")
        + ".",
        "",
    ]
    if best is None:
        lines += ["No remedy fixes it.", ""]
    else:
        lines += [
            f"**Recommended**: `{best.name}` ({best.remedy.fix_class}): {best.remedy.label}.",
            "",
            f"Check it: `python -m stability check {source} --variant {best.variant}`",
            "",
        ]
        fixes = doctor.code_fixes(best)
        if fixes:
            lines += ["The fix as code:", "", "```diff"]
            for fix in fixes:
                lines += [f"# {fix.where}", f"- {fix.before}", f"+ {fix.after}"]
            lines += ["```", ""]
    lines += [
        "| remedy | class | verdict | what still breaks, or why it does not apply |",
        "| --- | --- | --- | --- |",
    ]
    for repair in sorted(doctor.repairs, key=lambda r: (r.case is None, r.name)):
        what = "; ".join(f"`{k}`: {v}" for k, v in (repair.broken or {}).items())
        why = (what or repair.reason).replace("|", "/")
        lines.append(f"| `{repair.name}` | {repair.remedy.fix_class} | {repair.verdict} | {why} |")
    return [*lines, ""]
