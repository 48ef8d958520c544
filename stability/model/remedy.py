"""What a remedy is, and the registry of them: one type for every change the doctor can
make without the user writing code, whether it changes the model, the optimizer, the data
or a case setting. The built-in remedies are ``stability.model.remedies``; a remedy of your
own is one decorated function in your own module, as there.

A ``Remedy`` holds everything said about it once: its name, the symptoms it is for and
why (``helps``) and why not for the others (``cannot``), what it changes, when it applies
(its own predicate, ``applies``), and the change in the user's code it stands for
(``code``). It changes one of two things:

- a **model remedy** changes a built variant's recipe (``model``: its model, optimizer or
  gradients), so that a variant with it applied is a variant too: ``raw_e+clip``, or with
  the layer a remedy acts in, ``my_gat+kernel_constraint@edge_attention``;
- a **case remedy** changes one case key (``key``) to the value its function computes from
  the case (``value``): ``learning_rates``, ``batch_sizes``, ``dtype``, ``edge_transform``,
  ``self_loops``.

Why it lives in the model layer, below the sweep that defines ``Case`` and the doctor that
runs remedies: a model remedy must be a variant name every command resolves
(``variants.get_variant``), and the seed's controls (``grad_clip``, ``weight_constrained``)
are built from the same changes and constants. So a remedy sees a case and a doctor's trial
only through the two protocols below, ``CaseLike`` and ``Target``: what a remedy changes in
a case is plain data (a case key and its value), and whether it applies is asked of a
``Target`` that the doctor implements (the case before and after, their data, the remedied
variant built). Nothing here imports the sweep or the doctor.

A failure's *symptom* is its cause (``core.failures.Cause``), or ``divergence`` for a run
whose validation MAE blew up without a NaN, or ``headroom`` for a finite run that came near
``exp``'s limits. The doctor tries every remedy anyway; its verdict comes from the reruns,
not from ``helps`` (docs/doctor.md).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from stability.core.errors import NameNotFound, StabilityError
from stability.core.failures import Cause
from stability.core.registry import Registry
from stability.data.registry import Dataset
from stability.model.recipe import BuildContext, Recipe, Variant

#: A run whose validation MAE blew up before any NaN (``train.run_summary.divergence``).
DIVERGENCE = "divergence"
#: A finite run whose exp arguments came within the warning margin of a limit.
HEADROOM = "headroom"
#: A forward overflow at a linear op (a MatMul, a bias, a sum), not at an ``exp``: the
#: weights or the activations the updates grew, which no exp remedy touches.
WEIGHT_GROWTH = "weight growth"

#: Every symptom the doctor treats: each cause of a failure, the two without a NaN, and a
#: forward overflow read by its op (``WEIGHT_GROWTH``).
SYMPTOMS = (
    *(c.value for c in Cause if c not in (Cause.NONE, Cause.INPUT)),
    DIVERGENCE,
    HEADROOM,
    WEIGHT_GROWTH,
)

#: The classes of fix a numerical bug's maintainers make, each remedy's among them
#: (``Remedy.fix_class``): the zoo scores the doctor's fix against the maintainers' class.
OP_GUARD = "op guard"
FIX_CLASSES = (
    OP_GUARD,
    "stable reformulation",
    "data cleaning",
    "dtype",
    "optimizer setting",
    "architecture change",
)

#: What joins a variant's name and a remedy's in the name of the remedied variant.
REMEDY_MARK = "+"

#: What joins a remedy's name and the layer it acts in: ``kernel_constraint@message_passing_0``.
LAYER_MARK = "@"

#: A model remedy's change: ``(recipe, ctx, layer) -> recipe`` (``layer``: the layer path
#: after ``@``, or None); raises ``RemedyError`` when it cannot act on the recipe.
RecipeChange = Callable[[Recipe, BuildContext, "str | None"], Recipe]


class CaseLike(Protocol):
    """The case keys a remedy reads (``stability.sweep.cases.Case`` has them all)."""

    learning_rates: tuple[float, ...]
    batch_sizes: tuple[int, ...]
    dtype: str
    edge_transform: str
    self_loops: bool


class Target(Protocol):
    """What a remedy's predicate may ask of the trial it is checked for (the doctor's).
    ``before`` and ``after`` are the case without and with the remedy, ``data_before()`` and
    ``data_after()`` their data sets; ``recipe()`` is the remedied variant built on the
    first of them as its first run would be (``RemedyError`` when it cannot be built), and
    ``learning_rate`` that run's learning rate; ``failing_ops`` the op types the failure
    names (the failing op's, and for a gradient op the forward op's whose gradient it is);
    ``producer_ops`` the types of the ops that feed it inside the failing layer, nearest
    first (``stability.model.op_guard.producer_types``), where the doctor traced them."""

    before: CaseLike
    after: CaseLike
    learning_rate: float
    failing_ops: tuple[str, ...]
    producer_ops: tuple[str, ...]

    def data_before(self) -> Sequence[Dataset]: ...

    def data_after(self) -> Sequence[Dataset]: ...

    def recipe(self) -> Recipe: ...


#: A remedy's predicate: the reason it does not apply to the target, or None when it does.
Applies = Callable[[Target], "str | None"]


@dataclass(frozen=True)
class Remedy:
    """One remedy (module docstring). ``changes(case, variant, layer)`` gives the case keys
    it changes for a trial of ``variant``; ``reason(symptom)`` why it is expected to help
    ``symptom``, or why it cannot; ``fix_class`` is the class of fix it is (one of
    ``FIX_CLASSES``; a variant of the user's own is an architecture change)."""

    name: str
    family: str
    label: str
    code: str
    helps: Mapping[str, str] = field(default_factory=dict)
    cannot: str = ""
    model: RecipeChange | None = None
    description: str = ""
    takes_layer: bool = False
    key: str | None = None
    value: Callable[[CaseLike], Any] | None = None
    applies: Applies | None = None
    fix_class: str = "architecture change"

    def __post_init__(self) -> None:
        if self.fix_class not in FIX_CLASSES:
            raise StabilityError(
                f"remedy {self.name}: fix_class {self.fix_class!r} not one of {FIX_CLASSES}"
            )

    def changes(self, case: CaseLike, variant: str, layer: str | None) -> dict[str, Any]:
        """The case keys this remedy changes on ``case`` for ``variant`` (failing in
        ``layer``): the remedied variant for a model remedy, else its key's new value."""
        if self.model is not None:
            where = layer if self.takes_layer else None
            return {"variants": (remedied_name(variant, self.name, where),)}
        if self.key is None or self.value is None:
            return {}
        return {self.key: self.value(case)}

    @property
    def is_op_guard(self) -> bool:
        """Whether this remedy is an op guard (``stability.model.op_guard``), whatever its
        class of fix: it acts at the failing layer's ops, and the doctor records its sites."""
        return self.family == OP_GUARD

    def why_not(self, target: Target) -> str | None:
        """The reason this remedy does not apply to ``target``, or None when it does."""
        return self.applies(target) if self.applies is not None else None

    def expected(self, symptom: str) -> bool:
        """Whether this remedy is expected to help ``symptom``."""
        return symptom in self.helps

    def reason(self, symptom: str) -> str:
        """Why it is expected to help ``symptom``, or why it cannot."""
        return self.helps.get(symptom, self.cannot)


_remedies: Registry[Remedy] = Registry("remedy")  # name -> Remedy, in the doctor's order


def _register(fn: Callable[..., Any], **fields: Any) -> Callable[..., Any]:
    """Store the remedy named after ``fn``, owned by it, and return ``fn`` unchanged."""
    _remedies.add(fn.__name__, Remedy(fn.__name__, **fields), owner=fn)
    return fn


def model_remedy(*, takes_layer: bool = False, **fields: Any) -> Callable[..., Any]:
    """Decorator: register ``fn(recipe, ctx, layer) -> recipe`` as the model remedy of its
    name, with ``Remedy``'s fields ``family``, ``label``, ``description`` (the remedied
    variant's, after its base variant's), ``code``, ``helps``, ``cannot`` and, where it
    does not always apply, ``applies``; ``takes_layer`` for one that acts in the failing
    layer (``@layer``)."""
    return lambda fn: _register(fn, model=fn, takes_layer=takes_layer, **fields)


def case_remedy(*, key: str, **fields: Any) -> Callable[..., Any]:
    """Decorator: register ``fn(case) -> value`` as the remedy of its name that sets the
    case key ``key`` to that value, with ``Remedy``'s fields ``family``, ``label``,
    ``code``, ``helps``, ``cannot`` and, where it does not always apply, ``applies``."""
    return lambda fn: _register(fn, key=key, value=fn, **fields)


def get_remedy(name: str) -> Remedy:
    """The remedy called ``name``; an unknown name raises ``NameNotFound`` with a suggestion."""
    return _remedies.get(name)


def list_remedies() -> list[Remedy]:
    """Every registered remedy, in the order registered (the doctor's report's order)."""
    return _remedies.entries()


def _model_remedies() -> dict[str, Remedy]:
    return {r.name: r for r in list_remedies() if r.model is not None}


def get_model_remedy(name: str) -> Remedy:
    """The model remedy called ``name`` (one a variant name can carry after ``+``)."""
    found = _model_remedies()
    if name not in found:
        raise NameNotFound("model remedy", name, found)
    return found[name]


def list_model_remedies() -> list[str]:
    return sorted(_model_remedies())


def at_layer(remedy: str, layer: str | None) -> str:
    """``kernel_constraint@message_passing_0``, or the remedy's own name with no layer."""
    return f"{remedy}{LAYER_MARK}{layer}" if layer else remedy


def remedied_name(variant: str, remedy: str, layer: str | None = None) -> str:
    """``raw_e+clip``, or ``raw_e+kernel_constraint@message_passing_0`` with a layer."""
    return f"{variant}{REMEDY_MARK}{at_layer(remedy, layer)}"


def remedied_variant(name: str, lookup: Callable[[str], Variant]) -> Variant:
    """The variant ``base+remedy[@layer][+remedy[@layer]...]``: ``base`` (found by
    ``lookup``, the registry's) built as registered, then each remedy applied in turn once
    its model is built (``Variant.adjust``). A chain is how the doctor repairs ops that
    fail one after another (an op guard in each failing layer)."""
    base_name, *specs = name.split(REMEDY_MARK)
    if not base_name or not specs or not all(specs):
        raise StabilityError(
            f"variant {name!r}: a remedied variant is VARIANT{REMEDY_MARK}REMEDY[@LAYER], "
            f"remedies joined by {REMEDY_MARK!r}, of: {', '.join(list_model_remedies())}"
        )
    if len(set(specs)) != len(specs):
        raise StabilityError(f"variant {name!r}: names one remedy twice in the same place")
    base = lookup(base_name)
    changes = [_change(name, spec) for spec in specs]

    def adjust(recipe: Recipe, ctx: BuildContext) -> Recipe:
        changed = base.adjust(recipe, ctx) if base.adjust is not None else recipe
        for change, layer in changes:
            changed = change(changed, ctx, layer)
        return changed

    remedies = "; ".join(get_model_remedy(s.partition(LAYER_MARK)[0]).description for s in specs)
    description = f"{base.description}; doctor's remedy: {remedies}"
    return Variant(name, description, base.build, adjust)


def _change(name: str, spec: str) -> tuple[RecipeChange, str | None]:
    """One ``remedy[@layer]`` of a remedied variant's name: its change and layer."""
    remedy_name, _, layer = spec.partition(LAYER_MARK)
    remedy = get_model_remedy(remedy_name)
    if layer and not remedy.takes_layer:
        raise StabilityError(f"variant {name!r}: remedy {remedy_name!r} takes no {LAYER_MARK}layer")
    assert remedy.model is not None  # a model remedy's, by get_model_remedy
    return remedy.model, layer or None


def chain_parts(name: str) -> list[str]:
    """The remedies a (chained) remedy's name joins, without their layers:
    ``guard_pow+guard_pow@second`` -> ``["guard_pow", "guard_pow"]``."""
    return [part.partition(LAYER_MARK)[0] for part in name.split(REMEDY_MARK)]
