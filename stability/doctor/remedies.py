"""The doctor's table: every remedy it can apply without the user writing code, what it
changes in the case, and for which failures it is expected to help, and why.

A remedy is a change of the case the failure was found on: a setting (a lower learning
rate, a larger batch, float64, transformed edge distances, self-loops) or the variant with
a model remedy applied (``stability.model.remedies``: ``raw_e+clip``). Each remedy's runs are an
ordinary case, so ``python -m stability run CASE --variants V --set K=V`` reproduces them
(``Remedy.command``).

A failure's *symptom* is its cause (``core.failures.CAUSES``), or ``divergence`` for a run
whose validation MAE blew up without a NaN, or ``headroom`` for a finite run that came near
``exp``'s limits. ``helps`` says which symptoms a remedy addresses and why; for every other
symptom ``cannot`` says why it cannot help. The doctor tries every remedy anyway and its
verdict comes from the reruns, not from this table (docs/doctor.md).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from stability.core.errors import RemedyError
from stability.core.failures import Cause
from stability.core.limits import exp_limits
from stability.model.remedies import get_model_remedy, remedied_name
from stability.sweep.cases import Case
from stability.sweep.settings import toml

#: A run whose validation MAE blew up before any NaN (``train.run_summary.divergence``).
DIVERGENCE = "divergence"
#: A finite run whose exp arguments came within the warning margin of a limit.
HEADROOM = "headroom"

#: Every symptom the doctor treats: each cause of a failure, and the two without a NaN.
SYMPTOMS = (
    *(c.value for c in Cause if c not in (Cause.NONE, Cause.INPUT)),
    DIVERGENCE,
    HEADROOM,
)

_FORWARD_SYMPTOMS = (
    Cause.FORWARD_OVERFLOW.value,
    Cause.FORWARD_UNDERFLOW.value,
    Cause.NORMALIZATION.value,
    HEADROOM,
)

#: Dividing the learning rate by this is the lower learning rate.
LR_FACTOR = 10.0
#: Multiplying the batch size by this is the larger batch.
BATCH_FACTOR = 4


@dataclass(frozen=True)
class Remedy:
    """One remedy. ``change(case, variant, layer)`` returns the ``Case`` fields it changes
    (``variants`` among them for a model remedy), or raises ``RemedyError`` when it cannot
    apply to that case; ``code`` is the change in the user's code or case file."""

    name: str
    family: str
    label: str
    change: Callable[[Case, str, str | None], dict[str, Any]]
    code: str
    helps: Mapping[str, str] = field(default_factory=dict)
    cannot: str = ""

    def expected(self, symptom: str) -> bool:
        """Whether the table expects this remedy to help ``symptom``."""
        return symptom in self.helps

    def reason(self, symptom: str) -> str:
        """Why it is expected to help ``symptom``, or why it cannot."""
        return self.helps.get(symptom, self.cannot)


def case_for(remedy: Remedy, case: Case, variant: str, layer: str | None, name: str) -> Case:
    """``case`` (already cut to ``variant``'s runs) with ``remedy`` applied, named ``name``."""
    changes = remedy.change(case, variant, layer)
    return replace(case, name=name, **{"variants": (variant,), **changes})


def command(case_path: str, remedied: Case, original: Case) -> str:
    """The ``python -m stability run`` line that trains ``remedied``'s runs."""
    flags = [f"--variants {','.join(remedied.variants)}"]
    keys = ("seeds", "batch_sizes", "learning_rates", "epochs", "dtype")
    for key in (*keys, "edge_transform", "self_loops"):
        value = getattr(remedied, key)
        if key in ("seeds", "epochs") or value != getattr(original, key):
            shown = toml(list(value) if isinstance(value, tuple) else value)
            flags.append(f"--set '{key}={shown}'")
    return f"python -m stability run {case_path} " + " ".join(flags)


def _model(remedy_name: str) -> Callable[[Case, str, str | None], dict[str, Any]]:
    def change(case: Case, variant: str, layer: str | None) -> dict[str, Any]:
        takes = get_model_remedy(remedy_name).takes_layer
        return {"variants": (remedied_name(variant, remedy_name, layer if takes else None),)}

    return change


def _lower_lr(case: Case, variant: str, layer: str | None) -> dict[str, Any]:
    return {"learning_rates": tuple(lr / LR_FACTOR for lr in case.learning_rates)}


def _larger_batch(case: Case, variant: str, layer: str | None) -> dict[str, Any]:
    return {"batch_sizes": tuple(b * BATCH_FACTOR for b in case.batch_sizes)}


def _float64(case: Case, variant: str, layer: str | None) -> dict[str, Any]:
    if case.dtype == "float64":
        raise RemedyError("the case already trains in float64")
    return {"dtype": "float64"}


def _edges(how: str) -> Callable[[Case, str, str | None], dict[str, Any]]:
    def change(case: Case, variant: str, layer: str | None) -> dict[str, Any]:
        if case.edge_transform != "none":
            raise RemedyError(f"the case already has edge_transform = {case.edge_transform!r}")
        return {"edge_transform": how}

    return change


def _self_loops(case: Case, variant: str, layer: str | None) -> dict[str, Any]:
    if case.self_loops:
        raise RemedyError("the case already has self_loops = true")
    return {"self_loops": True}


def candidate(name: str) -> Remedy:
    """The user's own candidate variant (``--candidates``), tried as a remedy."""
    return Remedy(
        name=f"candidate:{name}",
        family="candidate",
        label=f"your candidate variant `{name}`",
        change=lambda case, variant, layer: {"variants": (name,)},
        code=f"the variant `{name}`",
        helps=dict.fromkeys(SYMPTOMS, "named with --candidates"),
    )


_F32, _F64 = exp_limits("float32"), exp_limits("float64")
_EDGE_HELP = (
    "the attention logits are made of the unscaled distance; on the scale of the other "
    "inputs they start far from exp's limits"
)
_LOGIT_HELP = "bounds what reaches exp, so its result is neither inf nor 0"

#: The doctor's remedies, in the order its report lists them.
REMEDIES: tuple[Remedy, ...] = (
    Remedy(
        "clip",
        "optimizer",
        "gradient clipping (the seed's: clipnorm 1, global norm 1, value 5)",
        _model("clip"),
        get_model_remedy("clip").code,
        helps={
            Cause.GRADIENT_EXPLOSION.value: "bounds the step a huge gradient makes",
            Cause.OPTIMIZER.value: "a bounded gradient keeps Adam's moments g and g*g finite",
            DIVERGENCE: "bounds each update, so one bad batch cannot undo the training",
        },
        cannot="it acts on the gradients after the forward pass and the loss are computed; "
        "no forward value changes, so the weights still drift to where the forward pass "
        "fails",
    ),
    Remedy(
        "lower_lr",
        "optimizer",
        f"learning rate divided by {LR_FACTOR:g}",
        _lower_lr,
        f"keras.optimizers.Adam(learning_rate / {LR_FACTOR:g}), or learning_rates in the case",
        helps={DIVERGENCE: "smaller steps keep the optimizer from overshooting"},
        cannot="every step is scaled alike, so the weights drift to the same failing place "
        f"{LR_FACTOR:g} times more slowly: it can delay that failure, not remove it",
    ),
    Remedy(
        "adam_epsilon",
        "optimizer",
        "a larger Adam epsilon",
        _model("adam_epsilon"),
        get_model_remedy("adam_epsilon").code,
        helps={
            Cause.OPTIMIZER.value: "bounds the update m / (sqrt(v) + eps) where v is ~0",
            Cause.MASKED_GRADIENT.value: "bounds the update where a masked gradient left v ~0",
        },
        cannot="it changes only the update's denominator, not a forward value or a gradient",
    ),
    Remedy(
        "larger_batch",
        "batch size",
        f"batch size times {BATCH_FACTOR}",
        _larger_batch,
        f"batch_sizes {BATCH_FACTOR} times larger in the case",
        helps={
            DIVERGENCE: "the gradient is averaged over more graphs, so it is less noisy",
            Cause.GRADIENT_EXPLOSION.value: "averaging over more graphs damps one graph's "
            "huge gradient",
        },
        cannot="averaging over more graphs changes the gradient's noise, not what one "
        "graph's forward pass computes: a graph that overflows still does in a larger batch",
    ),
    Remedy(
        "float64",
        "dtype",
        "float64",
        _float64,
        'dtype = "float64" in the case (every layer in float64)',
        helps={
            Cause.FORWARD_OVERFLOW.value: f"exp overflows at {_F64.overflow:.2f} instead of "
            f"float32's {_F32.overflow:.2f}",
            Cause.FORWARD_UNDERFLOW.value: f"exp reaches 0 below -{_F64.underflow:.2f} "
            f"instead of float32's -{_F32.underflow:.2f}",
            Cause.LOSS.value: "the loss overflows at 1.8e308 instead of 3.4e38",
            Cause.OPTIMIZER.value: "g*g overflows at |g| = 1.3e154 instead of 1.8e19",
            HEADROOM: "moves every limit the run came near far away",
        },
        cannot="more range does not change what the model computes: a value that keeps "
        "growing reaches float64's limits too",
    ),
    Remedy(
        "standardized_e",
        "data",
        "edge distances standardized with the training set's mean and std",
        _edges("standardized"),
        "e = (e - mean) / std with the training set's mean and std, before the model",
        helps=dict.fromkeys(_FORWARD_SYMPTOMS, _EDGE_HELP),
        cannot="it rescales one input; a failure that does not start from the distances' "
        "scale is left as it was",
    ),
    Remedy(
        "squashed_e",
        "data",
        "edge distances squashed by a sigmoid",
        _edges("squashed"),
        "e = sigmoid(e) before the model",
        helps=dict.fromkeys(_FORWARD_SYMPTOMS, _EDGE_HELP),
        cannot="it bounds one input; a failure that does not start from the distances' "
        "scale is left as it was",
    ),
    Remedy(
        "self_loops",
        "data",
        "an edge from every node to itself (distance 0)",
        _self_loops,
        "g = dgl.add_self_loop(g), or self_loops = true in the case",
        helps=dict.fromkeys(
            (
                Cause.FORWARD_OVERFLOW.value,
                Cause.FORWARD_UNDERFLOW.value,
                Cause.NORMALIZATION.value,
                Cause.NONFINITE_GRADIENT_OP.value,
            ),
            "a node without an incoming edge aggregates an empty set: degree 0 (deg^-1/2 "
            "is inf), the lowest float as its segment max, 0 as its softmax denominator or "
            "sum of exponentials; with a self-loop no neighbourhood is empty",
        ),
        cannot="it gives nodes without an incoming edge a neighbour; a failure that does "
        "not start from an empty neighbourhood is left as it was",
    ),
    Remedy(
        "kernel_constraint",
        "model",
        "MinMaxNorm(1e-30, 1) and l2(1e-6) on the Dense kernels in the failing layer",
        _model("kernel_constraint"),
        get_model_remedy("kernel_constraint").code,
        helps={
            **dict.fromkeys(
                _FORWARD_SYMPTOMS,
                "a kernel of norm at most 1 bounds each logit by the norm of its input "
                "(the seed's accepted fix)",
            ),
            Cause.GRADIENT_EXPLOSION.value: "bounded kernels bound the activations the "
            "gradient is made of",
            DIVERGENCE: "bounded kernels cannot run away",
        },
        cannot="it bounds the kernels, not the inputs or the ops after them",
    ),
    Remedy(
        "stable_softmax",
        "model",
        "the max-subtracted softmax",
        _model("stable_softmax"),
        get_model_remedy("stable_softmax").code,
        helps={
            Cause.FORWARD_OVERFLOW.value: "every exp argument is <= 0, so exp cannot overflow",
            Cause.FORWARD_UNDERFLOW.value: "each node's largest term is exactly 1, so no "
            "denominator is 0",
            Cause.NORMALIZATION.value: "each node's largest term is exactly 1, so its weights "
            "sum to 1",
            HEADROOM: "exp never sees the raw logit",
        },
        cannot="it changes the softmax only: a failure elsewhere stays",
    ),
    Remedy(
        "tanh_cap",
        "model",
        "attention logits bounded by 5 tanh(logit / 5)",
        _model("tanh_cap"),
        get_model_remedy("tanh_cap").code,
        helps={
            Cause.FORWARD_OVERFLOW.value: _LOGIT_HELP,
            Cause.FORWARD_UNDERFLOW.value: _LOGIT_HELP,
            Cause.NORMALIZATION.value: _LOGIT_HELP,
            HEADROOM: _LOGIT_HELP,
        },
        cannot="it bounds the attention logits only: a failure elsewhere stays",
    ),
)


def get_remedy(name: str) -> Remedy:
    return {r.name: r for r in REMEDIES}[name]
