"""The data set registry: ``Dataset`` (train/validation graphs and their statistics) and the
verbs that register, list, build and rebuild data sets by name.

The built-in data sets (``synthetic``, ``generated``, ``g2``) live in modules of their own
that register themselves; ``stability.data`` imports them, so this module imports none.
"""

from __future__ import annotations

import ast
import copy
import inspect
import math
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from stability.core.errors import DataError, StabilityError
from stability.core.registry import Registry
from stability.data.graphs import (
    Graph,
    graph_label,
    nonfinite_field,
    nonfinite_message,
    validate_graph,
)


@dataclass(frozen=True)
class Dataset:
    """Train and validation graphs, split by graph, plus the training set's statistics.

    ``key`` is a string that regenerates the data set exactly (the CSV ``dataset`` column).
    A registered builder leaves it out: ``load_dataset`` derives it from the builder's name
    and arguments (``dataset_key``) and sets it, replacing any key the builder gave.
    Graphs are numbered train first, then validation, in error messages. Shapes and edge
    endpoints are checked here; NaN and +-Inf values are named by ``nonfinite_input``
    (``load_dataset`` refuses them unless asked to allow them).

    What a report says about the data, over train and validation together: ``num_edges``,
    the smallest and largest finite edge distance ``edge_min`` and ``edge_max`` (NaN without
    edges), ``isolated_nodes`` (nodes no edge enters: an isolated atom in a molecule, as in
    the hunt's column of that name), ``graphs_without_edges``, and ``cutoff``, the distance
    beyond which the builder dropped every pair (``None`` where it drops none).
    ``num_train_graphs`` and ``num_val_graphs`` count the split.
    """

    key: str | None = None
    train: list[Graph] = field(default_factory=list)
    val: list[Graph] = field(default_factory=list)
    cutoff: float | None = None
    #: The edges are a transformed feature (``stability.data.edge_transform``), not
    #: distances: negative values are allowed.
    signed_edges: bool = False
    target_mean: float = field(init=False)
    target_std: float = field(init=False)
    edge_mean: float = field(init=False)
    edge_std: float = field(init=False)
    #: (graph index, field) of the first graph holding NaN or +-Inf, else ``None``.
    nonfinite_input: tuple[int, str] | None = field(init=False)
    num_edges: int = field(init=False)
    edge_min: float = field(init=False)
    edge_max: float = field(init=False)
    isolated_nodes: int = field(init=False)
    graphs_without_edges: int = field(init=False)

    def __post_init__(self) -> None:
        if not self.train or not self.val:
            raise _refusal(
                self.key,
                "needs at least one training and one validation graph, "
                f"got {len(self.train)} and {len(self.val)}",
            )
        graphs = self.train + self.val
        object.__setattr__(self, "nonfinite_input", None)
        for index, graph in enumerate(graphs):
            try:
                validate_graph(graph, index, allow_nonfinite=True, allow_negative=self.signed_edges)
            except DataError as exc:
                raise _refusal(self.key, str(exc)) from None
            features = graph.nodes.shape[1]
            if features != graphs[0].nodes.shape[1]:
                raise _refusal(
                    self.key,
                    f"{graph_label(graph, index)}: nodes have {features} features, "
                    f"graph 0 has {graphs[0].nodes.shape[1]}",
                )
            bad = nonfinite_field(graph)
            if bad is not None and self.nonfinite_input is None:
                object.__setattr__(self, "nonfinite_input", (index, bad))
        # A constant target or edge set would divide by zero when standardizing.
        # (Statistics of data holding NaN or Inf are NaN; such data is never trained on.)
        with np.errstate(invalid="ignore"):
            self._set_statistics()
        self._set_counts(graphs)

    def nonfinite_graphs(self) -> list[tuple[str, str]]:
        """``(graph label, field)`` of every graph (training, then validation) that holds
        NaN or +-Inf, the field being the first of nodes, edges and target that does."""
        found = []
        for index, graph in enumerate(self.train + self.val):
            bad = nonfinite_field(graph)
            if bad is not None:
                found.append((graph_label(graph, index), bad))
        return found

    def _set_statistics(self) -> None:
        targets = np.array([g.target for g in self.train])
        edges = np.concatenate([g.edges.ravel() for g in self.train])
        object.__setattr__(self, "target_mean", float(targets.mean()))
        object.__setattr__(self, "target_std", float(targets.std()) or 1.0)
        object.__setattr__(self, "edge_mean", float(edges.mean()) if edges.size else 0.0)
        object.__setattr__(self, "edge_std", float(edges.std()) if edges.size else 1.0)
        if self.edge_std == 0.0:
            object.__setattr__(self, "edge_std", 1.0)

    def _set_counts(self, graphs: list[Graph]) -> None:
        # [num_edges] every distance of the data set, NaN and +-Inf left out
        distances = np.concatenate([g.edges.ravel() for g in graphs])
        finite = distances[np.isfinite(distances)]
        received = [
            np.bincount(g.receivers.astype(np.int64), minlength=g.num_nodes) for g in graphs
        ]
        object.__setattr__(self, "num_edges", int(distances.size))
        object.__setattr__(self, "edge_min", float(finite.min()) if finite.size else math.nan)
        object.__setattr__(self, "edge_max", float(finite.max()) if finite.size else math.nan)
        object.__setattr__(self, "isolated_nodes", sum(int((r == 0).sum()) for r in received))
        object.__setattr__(self, "graphs_without_edges", sum(g.num_edges == 0 for g in graphs))

    @property
    def num_features(self) -> int:
        return int(self.train[0].nodes.shape[1])

    @property
    def num_train_graphs(self) -> int:
        return len(self.train)

    @property
    def num_val_graphs(self) -> int:
        return len(self.val)

    @classmethod
    def split(
        cls,
        graphs: Sequence[Graph],
        *,
        seed: int = 0,
        val_fraction: float = 0.2,
        cutoff: float | None = None,
    ) -> Dataset:
        """Split ``graphs`` by graph: ``val_fraction`` of them (at least one) drawn with
        ``seed`` for validation, the rest for training; ``cutoff`` as in ``Dataset``. What a
        registered builder returns: ``load_dataset`` gives it its key.

        Each graph keeps its place in ``graphs`` as its ``source_index`` (unless it has one),
        so errors name graphs by the user's own index, not by their place after the shuffle.
        """
        return cls.from_graphs(None, graphs, seed=seed, val_fraction=val_fraction, cutoff=cutoff)

    @classmethod
    def from_graphs(
        cls,
        key: str | None,
        graphs: Sequence[Graph],
        *,
        seed: int = 0,
        val_fraction: float = 0.2,
        cutoff: float | None = None,
    ) -> Dataset:
        """``Dataset.split(graphs, ...)`` named ``key``: for a data set built outside the
        registry."""
        if not 0.0 < val_fraction < 1.0:
            raise _refusal(key, f"val_fraction={val_fraction} must be in (0, 1)")
        numbered = [
            g if g.source_index is not None else replace(g, source_index=i)
            for i, g in enumerate(graphs)
        ]
        order = np.random.default_rng(seed).permutation(len(numbered))
        num_val = max(1, round(len(numbered) * val_fraction))
        return cls(
            key=key,
            train=[numbered[i] for i in order[num_val:]],
            val=[numbered[i] for i in order[:num_val]],
            cutoff=cutoff,
        )


class _UnkeyedDataError(DataError):
    """Graphs a ``Dataset`` without a key refused: ``load_dataset`` names the data set."""

    def __init__(self, detail: str):
        super().__init__(f"data set: {detail}")
        self.detail = detail


def _refusal(key: str | None, detail: str) -> DataError:
    """The error naming data set ``key``, or, before the registry gave it a key, one that
    ``load_dataset`` names."""
    return DataError(f"data set {key}: {detail}") if key is not None else _UnkeyedDataError(detail)


#: ``key_facts(arguments)``: the key's fields that are not the builder's arguments as given.
KeyFacts = Callable[[Mapping[str, object]], Mapping[str, object]]

_datasets: Registry[Callable[..., Dataset]] = Registry("data set")  # name -> builder(seed=...)
_key_facts: dict[Callable[..., Dataset], KeyFacts] = {}  # builder -> its key's facts


def register_dataset(
    fn: Callable[..., Dataset] | None = None, *, key_facts: KeyFacts | None = None
) -> Any:
    """Decorator, bare or with ``key_facts=``: register a data set builder under its function
    name (a name taken by another function is refused, as for variants).

    The builder's key is derived (``dataset_key``). ``key_facts(arguments)`` gives what a
    key must say beyond the arguments: a field named as an argument replaces how that
    argument is written (a file by its name), any other is added after the arguments (the
    file's SHA-256, the Hypothesis version that drew the graphs).
    """

    def decorate(builder: Callable[..., Dataset]) -> Callable[..., Dataset]:
        _datasets.register(builder)
        if key_facts is not None:
            _key_facts[builder] = key_facts
        return builder

    return decorate(fn) if fn is not None else decorate


def dataset_parameters(name: str) -> dict[str, object]:
    """The keyword parameters of data set ``name`` with their defaults."""
    builder = _datasets.get(name)
    return {
        p.name: p.default
        for p in inspect.signature(builder).parameters.values()
        if p.kind is inspect.Parameter.KEYWORD_ONLY
    }


def list_datasets() -> list[str]:
    return _datasets.names()


def load_dataset(name: str, *, allow_nonfinite: bool = False, **params: object) -> Dataset:
    """Build data set ``name`` with ``params`` (which must include ``seed``), keyed by
    ``dataset_key``.

    A graph holding NaN or +-Inf is a ``DataError`` naming it and the field, unless
    ``allow_nonfinite``: then the runs record ``first_nan_where = "input"`` untrained.
    """
    builder = _datasets.get(name)
    arguments = _arguments(name, builder, params)
    try:
        dataset = builder(**arguments)
    except _UnkeyedDataError as exc:
        raise DataError(f"data set {_key(name, builder, arguments)}: {exc.detail}") from None
    except StabilityError:
        raise
    except (ValueError, TypeError, OverflowError, MemoryError) as exc:
        # A parameter the builder's own libraries reject (a negative seed, say).
        raise DataError(f"data set {name}: {type(exc).__name__}: {exc}") from None
    dataset = _keyed(dataset, _key(name, builder, arguments))
    if dataset.nonfinite_input is not None and not allow_nonfinite:
        index, bad = dataset.nonfinite_input
        message = nonfinite_message((dataset.train + dataset.val)[index], index, bad)
        raise DataError(
            f"data set {dataset.key}: {message}; set allow_nonfinite_input = true in the case "
            "to record such runs as first_nan_where = input"
        )
    return dataset


def _keyed(dataset: Dataset, key: str) -> Dataset:
    """A copy of ``dataset`` named ``key``. Its graphs are those already checked: checking
    them again (``dataclasses.replace``) would cost a sixth of building the seed's data."""
    named = copy.copy(dataset)
    object.__setattr__(named, "key", key)
    return named


def dataset_key(name: str, params: Mapping[str, object]) -> str:
    """The key of ``load_dataset(name, **params)``, without building it.

    A call, ``name(arg=value,...)``: every parameter in the signature's order, defaults
    filled in, each value as Python writes it (``repr``; an integer given for a float
    parameter as a float), then the builder's ``key_facts``. ``key_call`` reads it back.
    """
    builder = _datasets.get(name)
    return _key(name, builder, _arguments(name, builder, params))


def _arguments(
    name: str, builder: Callable[..., Dataset], params: Mapping[str, object]
) -> dict[str, object]:
    """``params`` bound to the builder's parameters, defaults filled in, in its signature's
    order, each in the one form its key writes (so ``cutoff=4`` and ``cutoff=4.0`` are one
    data set)."""
    signature = inspect.signature(builder)
    try:
        bound = signature.bind(**params)
    except TypeError as exc:
        raise DataError(
            f"data set {name}: {exc}; its parameters are {', '.join(signature.parameters)}"
        ) from None
    bound.apply_defaults()
    arguments: dict[str, object] = {}
    for parameter in signature.parameters.values():
        value = bound.arguments.get(parameter.name)
        if parameter.kind is inspect.Parameter.VAR_KEYWORD:
            arguments.update(value or {})
        elif parameter.kind is not inspect.Parameter.VAR_POSITIONAL:
            arguments[parameter.name] = _canonical(value, parameter.default)
    _check_readable(name, arguments)
    return arguments


def _canonical(value: object, default: object) -> object:
    if isinstance(value, np.generic):  # a NumPy scalar, written as the Python number it is
        value = value.item()
    if isinstance(value, os.PathLike):
        value = os.fspath(value)
    if isinstance(default, float) and isinstance(value, int) and not isinstance(value, bool):
        value = float(value)
    return value


def _key(name: str, builder: Callable[..., Dataset], arguments: Mapping[str, object]) -> str:
    fields = _fields(name, builder, arguments)
    return f"{name}(" + ",".join(f"{k}={v!r}" for k, v in fields.items()) + ")"


def _fields(
    name: str, builder: Callable[..., Dataset], arguments: Mapping[str, object]
) -> dict[str, object]:
    """The key's fields: the arguments, then the builder's ``key_facts``."""
    fields = dict(arguments)
    facts = _key_facts.get(builder)
    if facts is not None:
        fields.update(facts(arguments))
        _check_readable(name, fields)
    return fields


def _check_readable(name: str, fields: Mapping[str, object]) -> None:
    """Refuse a value whose ``repr`` ``key_call`` would not read back as the value."""
    for field_name, value in fields.items():
        if not _reads_back(value):
            raise DataError(
                f"data set {name}: {field_name}={value!r} cannot be written into its key; "
                "expected a str, a finite int or float, a bool, None, or a tuple or list of them"
            )


def _reads_back(value: object) -> bool:
    """Whether ``key_call`` reads ``repr(value)`` back as ``value``."""
    try:
        return bool(ast.literal_eval(repr(value)) == value)
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
        return False


def key_call(key: str) -> tuple[str, dict[str, object]]:
    """The data set name and arguments of a key written as a call, ``name(arg=value,...)``
    (``generated(seed=0,...,hypothesis='6.170.17')``)."""
    try:
        call = ast.parse(key, mode="eval").body
        if not (isinstance(call, ast.Call) and isinstance(call.func, ast.Name)) or call.args:
            raise ValueError("not a call with keyword arguments")
        params = {kw.arg: ast.literal_eval(kw.value) for kw in call.keywords}
    except (SyntaxError, ValueError) as exc:
        raise StabilityError(
            f"data set key {key!r} cannot be rebuilt ({exc}); expected name(arg=value, ...)"
        ) from None
    return call.func.id, params


def dataset_from_key(key: str) -> Dataset:
    """Rebuild a data set from its key (as ``dataset_key`` writes it).

    The key's fields that name the builder's parameters are its arguments (a file named by
    its name is looked for in the working folder). Every field must come out the same in
    the rebuilt key, or the key names data that is no longer there: a file's SHA-256 that
    changed is an error, not another data set under the old key.
    """
    name, fields = key_call(key)
    builder = _datasets.get(name)
    parameters = inspect.signature(builder).parameters
    params = {k: v for k, v in fields.items() if k in parameters}
    dataset = load_dataset(name, **params)
    rebuilt = _fields(name, builder, _arguments(name, builder, params))
    for field_name, value in fields.items():
        if field_name not in rebuilt or rebuilt[field_name] != value:
            now = f"{field_name}={rebuilt[field_name]!r}" if field_name in rebuilt else "none"
            raise DataError(
                f"data set key {key!r} cannot be rebuilt: it names {field_name}={value!r}, "
                f"the data set built from it has {now}"
            )
    return dataset
