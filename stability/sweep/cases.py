"""Case files: a sweep described as data (TOML), parsed with ``tomllib`` and validated.

A case is parameters with names and no control flow. Every key is checked where it enters,
and a bad one gets a one-line ``CaseError`` naming the file, the key, the value and what
is accepted. The keys themselves, their defaults and what they accept are declared once, in
``stability.sweep.settings``.
"""

from __future__ import annotations

import tomllib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from stability.core.errors import CaseError, NameNotFound, StabilityError, did_you_mean
from stability.core.plugins import load_plugin, plugin_hint
from stability.data import dataset_parameters, list_datasets
from stability.model.variants import get_variant, list_variants
from stability.sweep.settings import CHECK, MODEL, TABLES, TOP_LEVEL, default, finite_number


@dataclass(frozen=True)
class Case:
    """A validated sweep: variants x seeds x batch sizes x learning rates on one data set."""

    name: str
    description: str = default("description")
    variants: tuple[str, ...] = ()
    seeds: tuple[int, ...] = default("seeds")
    batch_sizes: tuple[int, ...] = default("batch_sizes")
    learning_rates: tuple[float, ...] = default("learning_rates")
    epochs: int = default("epochs")
    dtype: str = field(default_factory=lambda: default("dtype"))
    stop_at_nan: bool = default("stop_at_nan")
    #: Compile the training step with XLA, on batches padded to one shape per run.
    jit_compile: bool = default("jit_compile")
    #: Data with NaN/Inf is an error unless this is set; then each run records
    #: ``first_nan_where = "input"`` without training (never counted as a training NaN).
    allow_nonfinite_input: bool = default("allow_nonfinite_input")
    hidden: int = default("hidden")
    num_layers: int = default("num_layers")
    dataset: str = "synthetic"
    dataset_params: Mapping[str, Any] = field(default_factory=dict)
    #: How many data sets to train every run on: data set k is built with seed
    #: ``dataset.seed + k`` (one draw per seed for the ``generated`` data set).
    num_datasets: int = default("num_datasets")
    #: How every edge distance is transformed before training (``stability.data.edge_transform``).
    edge_transform: str = default("edge_transform")
    #: Every node gets an edge to itself before training (``stability.data.self_loops``).
    self_loops: bool = default("self_loops")
    #: The case's own plugins (``plugins = [...]``), imported when the case was loaded.
    plugins: tuple[str, ...] = default("plugins")
    #: ``KEY=VALUE`` overrides given on the command line (``--set``), in order.
    overrides: tuple[str, ...] = ()
    #: Intra-op threads each run trains on (``--threads``; not a case key): 1 unless the
    #: rounding spread of another layout is being measured (``stability.train.threads``).
    threads: int = 1
    #: The ``[check]`` table: what ``stability check`` may assume of the model.
    check: Mapping[str, Any] = field(default_factory=dict)


# key -> (check, what is accepted), from the declared settings.
_TOP_LEVEL: dict[str, tuple[Callable[[Any], bool], str]] = {
    s.key: (s.check, s.accepted) for s in TOP_LEVEL
}
_MODEL: dict[str, tuple[Callable[[Any], bool], str]] = {s.key: (s.check, s.accepted) for s in MODEL}
_CHECK: dict[str, tuple[Callable[[Any], bool], str]] = {s.key: (s.check, s.accepted) for s in CHECK}
_TABLES = tuple(TABLES)


#: Data set parameters that name a file: a relative one is relative to the case file.
PATH_PARAMETERS = ("path",)


def load_case(path: str | Path, overrides: Sequence[str] = ()) -> Case:
    """Read and validate the case file at ``path``, with ``KEY=VALUE`` ``overrides``
    (``--set``) applied first and validated like the file."""
    path = Path(path)
    return parse_case(
        read_case_text(path),
        source=str(path),
        default_name=path.stem,
        base_dir=path.parent,
        overrides=overrides,
    )


def read_case_text(path: Path) -> str:
    """A case file's text; a missing or unreadable file is one ``CaseError`` line."""
    try:
        return path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise CaseError(f"{path}: no such case file") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise CaseError(f"{path}: cannot read the case file ({exc})") from None


def parse_case(
    text: str,
    source: str = "<case>",
    default_name: str = "case",
    base_dir: Path | None = None,
    overrides: Sequence[str] = (),
) -> Case:
    """Parse and validate case TOML ``text``; ``source`` names it in errors, ``base_dir``
    (default: the working folder) is what relative paths in it are relative to."""
    doc = parse_toml(text, source)
    for override in overrides:
        apply_override(doc, override)
    return case_from_doc(doc, source, default_name, base_dir, overrides)


def parse_toml(text: str, source: str = "<case>") -> dict[str, Any]:
    """The TOML ``text`` as a dict, or a one-line ``CaseError`` naming ``source``."""
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise CaseError(f"{source}: not valid TOML: {exc}") from None


def case_from_doc(
    doc: dict[str, Any],
    source: str = "<case>",
    default_name: str = "case",
    base_dir: Path | None = None,
    overrides: Sequence[str] = (),
) -> Case:
    """Validate a parsed case ``doc`` (its ``overrides`` already applied, and recorded)."""
    _check_keys(source, "", doc, [*_TOP_LEVEL, *_TABLES])
    for key, value in doc.items():
        if key in _TOP_LEVEL:
            _check_value(source, key, value, *_TOP_LEVEL[key])
    plugins = tuple(doc.get("plugins", ()))
    for plugin in plugins:
        try:
            load_plugin(plugin, base_dir)
        except StabilityError as exc:
            raise CaseError(f"{source}: plugins: {exc}") from None
    model = _table(source, doc, "model")
    _check_keys(source, "model.", model, list(_MODEL))
    for key, value in model.items():
        _check_value(source, f"model.{key}", value, *_MODEL[key])
    check = _table(source, doc, "check")
    _check_keys(source, "check.", check, list(_CHECK))
    for key, value in check.items():
        _check_value(source, f"check.{key}", value, *_CHECK[key])
    dataset_name, dataset_params = _dataset(source, _table(source, doc, "dataset"))
    for key in PATH_PARAMETERS:
        value = dataset_params.get(key)
        if isinstance(value, str) and value and not Path(value).is_absolute():
            dataset_params[key] = str((base_dir or Path.cwd()) / value)
    variants = tuple(doc.get("variants", [v.name for v in list_variants()]))
    for name in variants:
        try:
            get_variant(name)
        except StabilityError as exc:
            raise CaseError(f"{source}: variants: {plugin_hint(exc)}") from None
    top = {k: tuple(v) if isinstance(v, list) else v for k, v in doc.items() if k in _TOP_LEVEL}
    top.setdefault("name", default_name)
    top["variants"] = variants
    top["learning_rates"] = tuple(float(v) for v in top.get("learning_rates", Case.learning_rates))
    top["overrides"] = tuple(overrides)
    return Case(**top, **model, dataset=dataset_name, dataset_params=dataset_params, check=check)


def apply_override(doc: dict[str, Any], override: str) -> None:
    """Set ``KEY=VALUE`` in the parsed case ``doc``: ``KEY`` is a top-level key or
    ``table.key`` (``dataset.num_graphs``); ``VALUE`` is read as a TOML value (``20``,
    ``0.5``, ``true``, ``[0, 1]``, ``"text"``), or else taken as a string."""
    key, sep, text = override.partition("=")
    key = key.strip()
    parts = key.split(".")
    if not sep or not key or len(parts) > 2 or not all(parts):
        raise CaseError(
            f"--set {override!r}: expected KEY=VALUE, e.g. epochs=20 or dataset.num_graphs=200"
        )
    try:
        value = tomllib.loads(f"v = {text.strip()}")["v"]
    except tomllib.TOMLDecodeError:
        value = text.strip()  # a bare word: a name such as dataset.name=structures
    table = doc
    if len(parts) == 2:
        table = doc.setdefault(parts[0], {})
        if not isinstance(table, dict):
            raise CaseError(f"--set {override!r}: {parts[0]} is not a table in the case")
    table[parts[-1]] = value


def _table(source: str, doc: dict[str, Any], key: str) -> dict[str, Any]:
    value = doc.get(key, {})
    if not isinstance(value, dict):
        raise CaseError(f"{source}: [{key}] must be a table, got {value!r}")
    return value


def _dataset(source: str, table: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    name = table.get("name", "synthetic")
    if name not in list_datasets():
        _check_value(source, "dataset.name", name, lambda v: isinstance(v, str), "a string")
        unknown = plugin_hint(NameNotFound("data set", name, list_datasets()))
        raise CaseError(f"{source}: dataset.name = {name!r} is not valid; {unknown}")
    defaults = dataset_parameters(name)
    params = {k: v for k, v in table.items() if k != "name"}
    _check_keys(source, "dataset.", params, list(defaults))
    for key, value in params.items():
        default = defaults[key]
        if default is None:  # a parameter without a typed default takes any value
            continue
        kind = type(default)
        ok = isinstance(value, kind) and not (kind is int and isinstance(value, bool))
        if kind is float and isinstance(value, int) and not isinstance(value, bool):
            ok = finite_number(value)
            value = float(value) if ok else value
        if kind is float and ok and not finite_number(value):
            ok = False
        _check_value(source, f"dataset.{key}", value, lambda v, ok=ok: ok, f"a {kind.__name__}")
        params[key] = value
    return name, params


def _check_keys(source: str, prefix: str, table: Mapping[str, Any], known: list[str]) -> None:
    for key in table:
        if key not in known:
            hint = did_you_mean(key, known, prefix)
            raise CaseError(
                f"{source}: unknown key {prefix}{key!r}.{hint} Valid keys: {', '.join(known)}."
            )


def _check_value(
    source: str, key: str, value: Any, check: Callable[[Any], bool], accepted: str
) -> None:
    if not check(value):
        raise CaseError(f"{source}: {key} = {value!r} is not valid; expected {accepted}.")
