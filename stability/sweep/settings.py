"""Every setting of a case file, declared once: its key, type, default, what it accepts and
its line in docs/cases.md.

``stability.sweep.cases`` validates a case from ``SETTINGS``, ``Case`` takes its defaults
from them, ``runner.run_configs`` hands the per-run ones to each ``TrainConfig``, and
``settings_table`` renders the tables of docs/cases.md (``tests/test_docs.py`` checks that
the committed page holds them). A default that a run's ``TrainConfig`` also has is read
from ``TrainConfig``, not written again here.
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from stability.data.edge_transform import EDGE_TRANSFORMS
from stability.train.config import DTYPES, TrainConfig

_NO_DEFAULT = object()


def positive_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value > 0


def nonnegative_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def finite_number(value: Any) -> bool:
    """An int or float that converts to a finite float (a 400-digit TOML integer does not)."""
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        return False
    try:
        return math.isfinite(float(value))
    except OverflowError:
        return False


def positive_float(value: Any) -> bool:
    return finite_number(value) and value > 0


def list_of(check: Callable[[Any], bool]) -> Callable[[Any], bool]:
    return lambda value: isinstance(value, list) and bool(value) and all(map(check, value))


def boolean(value: Any) -> bool:
    return isinstance(value, bool)


def trained(name: str) -> Any:
    """``TrainConfig``'s default for ``name`` (its factory, for a computed one)."""
    found = {f.name: f for f in dataclasses.fields(TrainConfig)}[name]
    if found.default_factory is not dataclasses.MISSING:
        return found.default_factory
    return found.default


@dataclass(frozen=True)
class Setting:
    """One case key. ``accepted`` is what an error says is accepted and what the docs'
    "accepted" cell starts with; ``doc`` is the rest of that cell. ``default`` is a value, a
    zero-argument factory, or absent (the loader computes it; ``computed`` says how, in
    words). ``per_run``: the key is a ``TrainConfig`` field of the same name, passed to every
    run as it is."""

    key: str
    type: str
    check: Callable[[Any], bool]
    accepted: str
    doc: str = ""
    default: Any = _NO_DEFAULT
    computed: str = ""
    per_run: bool = False

    def default_value(self) -> Any:
        return self.default() if callable(self.default) else self.default


def _per_run(key: str, kind: str, check: Callable[[Any], bool], accepted: str, doc: str = ""):
    return Setting(key, kind, check, accepted, doc, default=trained(key), per_run=True)


_BOOL = "true or false"

#: The top-level keys of a case file, in the docs' order.
TOP_LEVEL = (
    Setting(
        "name",
        "string",
        lambda v: isinstance(v, str) and v.isidentifier(),
        "letters, digits and _",
        " (a Python identifier). Names `<name>.csv`, `<name>.md` and the `case` column.",
        computed="the file's name without `.toml`",
    ),
    Setting(
        "description",
        "string",
        lambda v: isinstance(v, str),
        "a string",
        ". Printed at the top of the report.",
        default="",
    ),
    Setting(
        "variants",
        "list of strings",
        list_of(lambda v: isinstance(v, str)),
        "a non-empty list of variant names",
        ", each registered (`python -m stability list`).",
        computed="every registered variant",
    ),
    Setting(
        "seeds",
        "list of integers",
        list_of(nonnegative_int),
        "a non-empty list of integers >= 0",
        ". One run per seed; the seed sets Python, NumPy and TensorFlow.",
        default=(0, 1, 2),
    ),
    Setting(
        "batch_sizes",
        "list of integers",
        list_of(positive_int),
        "a non-empty list of integers > 0",
        default=(trained("batch_size"),),
    ),
    Setting(
        "learning_rates",
        "list of floats",
        list_of(positive_float),
        "a non-empty list of numbers > 0",
        " (finite; an integer is read as a float)",
        default=(1e-2,),
    ),
    _per_run("epochs", "integer", positive_int, "an integer > 0", ". The budget of each run."),
    _per_run(
        "dtype",
        "string",
        lambda v: v in DTYPES,
        f"one of {', '.join(DTYPES)}",
        ". When a case does not name it, the environment variable `STABILITY_DTYPE` "
        "overrides the default.",
    ),
    _per_run(
        "stop_at_nan",
        "boolean",
        boolean,
        _BOOL,
        ". `false` applies the failing update and trains on, as an unguarded loop would.",
    ),
    _per_run(
        "jit_compile",
        "boolean",
        boolean,
        _BOOL,
        ". `true` compiles each run's step with XLA, on padded batches "
        "([performance.md](performance.md#xla)).",
    ),
    Setting(
        "allow_nonfinite_input",
        "boolean",
        boolean,
        _BOOL,
        ". `true` records runs on data holding NaN or Inf as `first_nan_where = input`, "
        "untrained, instead of stopping with an error "
        "([reliability.md](reliability.md#bad-input-data)).",
        default=False,
    ),
    Setting(
        "num_datasets",
        "integer",
        positive_int,
        "an integer > 0",
        ". The sweep repeats on this many data sets, one run per data set; data set k is "
        "built with seed `dataset.seed + k`.",
        default=1,
    ),
    Setting(
        "edge_transform",
        "string",
        lambda v: v in EDGE_TRANSFORMS,
        f"one of {', '.join(EDGE_TRANSFORMS)}",
        ". Transforms every edge distance before training: `standardized` with the "
        "training set's mean and std, `squashed` by a sigmoid (the doctor's data remedies, "
        "[doctor.md](doctor.md)).",
        default="none",
    ),
    Setting(
        "self_loops",
        "boolean",
        boolean,
        _BOOL,
        ". `true` adds an edge from every node to itself, of distance 0, before "
        "`edge_transform` and training, so no node is without a neighbour (the doctor's "
        "self-loop remedy, DGL's `dgl.add_self_loop`, [doctor.md](doctor.md)).",
        default=False,
    ),
    Setting(
        "plugins",
        "list of strings",
        lambda v: isinstance(v, list) and all(isinstance(p, str) and p for p in v),
        "a list of module names or .py paths (relative to the case file)",
        ". Imported before the rest of the case is checked, so the case can name the "
        "variants and data sets they register ([plugins.md](plugins.md)).",
        default=(),
    ),
)

#: The ``[model]`` keys.
MODEL = (
    _per_run(
        "hidden",
        "integer",
        positive_int,
        "an integer > 0",
        ". The width of node states, messages and the readout.",
    ),
    _per_run(
        "num_layers",
        "integer",
        positive_int,
        "an integer > 0",
        ". The number of message-passing layers.",
    ),
)

#: The ``[check]`` keys: what ``stability check`` may assume of the case's model. Their
#: values are checked here; the invariant names by ``stability check`` (docs/check.md).
CHECK = (
    Setting(
        "invariants",
        "list of strings",
        lambda v: isinstance(v, list) and all(isinstance(x, str) for x in v),
        "a list of invariant names",
        ": those that hold for the model (default: all of them; [check.md](check.md)).",
        computed="every invariant",
    ),
    Setting(
        "cutoff",
        "number",
        positive_float,
        "a number > 0",
        ": the distance where the model's messages vanish, checked for continuity.",
        computed="none",
    ),
)

#: The tables of a case file, after the top-level keys: table -> what its docs row says.
TABLES = {
    "model": "the `[model]` keys",
    "dataset": "the `[dataset]` keys",
    "check": "what `stability check` may assume of the model ([check.md](check.md))",
}

SETTINGS = {s.key: s for s in (*TOP_LEVEL, *MODEL)}


def default(key: str) -> Any:
    """The declared default of ``key``, as ``Case`` holds it (a factory is called)."""
    return SETTINGS[key].default_value()


def per_run(case: Any) -> dict[str, Any]:
    """The settings of ``case`` that every run's ``TrainConfig`` takes as they are."""
    return {key: getattr(case, key) for key, s in SETTINGS.items() if s.per_run}


def toml(value: Any) -> str:
    """``value`` as TOML text, as the docs show a default."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(toml(v) for v in value) + "]"
    if isinstance(value, str):
        return json.dumps(value)
    return repr(value)


def settings_table(scope: str) -> str:
    """The markdown table of docs/cases.md for ``scope``, "top" or "model"."""
    rows = ["| key | type | default | accepted |", "| --- | --- | --- | --- |"]
    for s in TOP_LEVEL if scope == "top" else MODEL:
        shown = s.computed if s.default is _NO_DEFAULT else f"`{toml(s.default_value())}`"
        rows.append(f"| `{s.key}` | {s.type} | {shown} | {s.accepted}{s.doc} |")
    if scope == "top":
        rows += [f"| `{key}` | table | see below | {text} |" for key, text in TABLES.items()]
    return "\n".join(rows) + "\n"
