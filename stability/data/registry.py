"""The data set registry: ``Dataset`` (train/validation graphs and their statistics) and the
verbs that register, list, build and rebuild data sets by name.

The built-in data sets (``synthetic``, ``generated``, ``g2``) live in modules of their own
that register themselves; ``stability.data`` imports them, so this module imports none.
"""

from __future__ import annotations

import ast
import inspect
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace

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

    key: str
    train: list[Graph]
    val: list[Graph]
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
            raise DataError(
                f"data set {self.key}: needs at least one training and one validation graph, "
                f"got {len(self.train)} and {len(self.val)}"
            )
        graphs = self.train + self.val
        object.__setattr__(self, "nonfinite_input", None)
        for index, graph in enumerate(graphs):
            try:
                validate_graph(graph, index, allow_nonfinite=True, allow_negative=self.signed_edges)
            except DataError as exc:
                raise DataError(f"data set {self.key}: {exc}") from None
            features = graph.nodes.shape[1]
            if features != graphs[0].nodes.shape[1]:
                raise DataError(
                    f"data set {self.key}: {graph_label(graph, index)}: nodes have {features} "
                    f"features, graph 0 has {graphs[0].nodes.shape[1]}"
                )
            bad = nonfinite_field(graph)
            if bad is not None and self.nonfinite_input is None:
                object.__setattr__(self, "nonfinite_input", (index, bad))
        # A constant target or edge set would divide by zero when standardizing.
        # (Statistics of data holding NaN or Inf are NaN; such data is never trained on.)
        with np.errstate(invalid="ignore"):
            self._set_statistics()
        self._set_counts(graphs)

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
    def from_graphs(
        cls,
        key: str,
        graphs: Sequence[Graph],
        *,
        seed: int = 0,
        val_fraction: float = 0.2,
        cutoff: float | None = None,
    ) -> Dataset:
        """Split ``graphs`` by graph: ``val_fraction`` of them (at least one) drawn with
        ``seed`` for validation, the rest for training; ``cutoff`` as in ``Dataset``.

        Each graph keeps its place in ``graphs`` as its ``source_index`` (unless it has one),
        so errors name graphs by the user's own index, not by their place after the shuffle.
        """
        if not 0.0 < val_fraction < 1.0:
            raise DataError(f"data set {key}: val_fraction={val_fraction} must be in (0, 1)")
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


_datasets: Registry[Callable[..., Dataset]] = Registry("data set")  # name -> builder(seed=...)


def register_dataset(fn: Callable[..., Dataset]) -> Callable[..., Dataset]:
    """Register a data set builder under its function name (a name taken by another function
    is refused, as for variants)."""
    return _datasets.register(fn)


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
    """Build data set ``name`` with ``params`` (which must include ``seed``).

    A graph holding NaN or +-Inf is a ``DataError`` naming it and the field, unless
    ``allow_nonfinite``: then the runs record ``first_nan_where = "input"`` untrained.
    """
    builder = _datasets.get(name)
    try:
        dataset = builder(**params)
    except StabilityError:
        raise
    except (ValueError, TypeError, OverflowError, MemoryError) as exc:
        # A parameter the builder's own libraries reject (a negative seed, say).
        raise DataError(f"data set {name}: {type(exc).__name__}: {exc}") from None
    if dataset.nonfinite_input is not None and not allow_nonfinite:
        index, bad = dataset.nonfinite_input
        message = nonfinite_message((dataset.train + dataset.val)[index], index, bad)
        raise DataError(
            f"data set {dataset.key}: {message}; set allow_nonfinite_input = true in the case "
            "to record such runs as first_nan_where = input"
        )
    return dataset


def key_call(key: str) -> tuple[str, dict[str, object]]:
    """The data set name and arguments of a key written as a call, like ``generated``'s
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
    """Rebuild a data set from its key, for keys written as calls, like ``generated``'s."""
    name, params = key_call(key)
    return load_dataset(name, **params)
