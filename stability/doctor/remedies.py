"""The doctor's side of the remedies (``stability.model.remedy``: the type and registry;
``stability.model.remedies``: the built-in ones, in the order the report lists them): a
remedy applied to the case the failure was found on, and the command that reproduces it.

A remedy is a change of that case: a setting (a lower learning rate, a larger batch,
float64, transformed edge distances, self-loops) or the variant with a model remedy applied
(``raw_e+clip``). Each remedy's runs are an ordinary case, so
``python -m stability run CASE --variants V --set K=V`` reproduces them (``command``).
"""

from __future__ import annotations

from dataclasses import fields, replace

from stability.model.remedy import (
    SYMPTOMS,
    Remedy,
    list_remedies,
)
from stability.sweep.cases import Case
from stability.sweep.settings import toml

#: The case keys the doctor's own cut of the case and its budget change (``run``).
_CUT = ("seeds", "batch_sizes", "learning_rates", "epochs")
#: Shown in every command, changed or not.
_ALWAYS = ("seeds", "epochs")


def case_for(remedy: Remedy, case: Case, variant: str, layer: str | None, name: str) -> Case:
    """``case`` (already cut to ``variant``'s runs) with ``remedy`` applied, named ``name``."""
    changes = remedy.changes(case, variant, layer)
    return replace(case, name=name, **{"variants": (variant,), **changes})


def command(case_path: str, remedied: Case, original: Case) -> str:
    """The ``python -m stability run`` line that trains ``remedied``'s runs: the seeds and
    epochs, and every other key the doctor's cut or a remedy changes that differs from
    ``original``'s, in the case's order."""
    changeable = {*_CUT, *(r.key for r in list_remedies() if r.key)}
    flags = [f"--variants {','.join(remedied.variants)}"]
    for key in (f.name for f in fields(Case) if f.name in changeable):
        value = getattr(remedied, key)
        if key in _ALWAYS or value != getattr(original, key):
            shown = toml(list(value) if isinstance(value, tuple) else value)
            flags.append(f"--set '{key}={shown}'")
    return f"python -m stability run {case_path} " + " ".join(flags)


def candidate(name: str) -> Remedy:
    """The user's own candidate variant (``--candidates``), tried as a remedy."""
    return Remedy(
        name=f"candidate:{name}",
        family="candidate",
        label=f"your candidate variant `{name}`",
        code=f"the variant `{name}`",
        helps=dict.fromkeys(SYMPTOMS, "named with --candidates"),
        key="variants",
        value=lambda case: (name,),
    )
