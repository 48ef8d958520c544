"""Graph data sets: the synthetic one that reproduces the seed's setting.

The seed's edge feature ``e`` is a distance in [0.5, 4]. ``synthetic`` builds graphs from
random 3-D points, one edge each way for every pair closer than ``cutoff``, and a target
that can only be fitted well by an attention that singles out one neighbour by its
distance. That pressure is what grows the attention logits in the seed's story.
"""

from __future__ import annotations

import ast
import inspect
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from stability.errors import DataError, NameNotFound, StabilityError
from stability.graphs import Graph, nonfinite_field, nonfinite_message, validate_graph


@dataclass(frozen=True)
class Dataset:
    """Train and validation graphs, split by graph, plus the training set's statistics.

    ``key`` is a string that regenerates the data set exactly (the CSV ``dataset`` column).
    Graphs are numbered train first, then validation, in error messages. Shapes and edge
    endpoints are checked here; NaN and +-Inf values are named by ``nonfinite_input``
    (``load_dataset`` refuses them unless asked to allow them).
    """

    key: str
    train: list[Graph]
    val: list[Graph]
    target_mean: float = field(init=False)
    target_std: float = field(init=False)
    edge_mean: float = field(init=False)
    edge_std: float = field(init=False)
    #: (graph index, field) of the first graph holding NaN or +-Inf, else ``None``.
    nonfinite_input: tuple[int, str] | None = field(init=False)

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
                validate_graph(graph, index, allow_nonfinite=True)
            except DataError as exc:
                raise DataError(f"data set {self.key}: {exc}") from None
            features = graph.nodes.shape[1]
            if features != graphs[0].nodes.shape[1]:
                raise DataError(
                    f"data set {self.key}: graph {index}: nodes have {features} features, "
                    f"graph 0 has {graphs[0].nodes.shape[1]}"
                )
            bad = nonfinite_field(graph)
            if bad is not None and self.nonfinite_input is None:
                object.__setattr__(self, "nonfinite_input", (index, bad))
        # A constant target or edge set would divide by zero when standardizing.
        # (Statistics of data holding NaN or Inf are NaN; such data is never trained on.)
        with np.errstate(invalid="ignore"):
            self._set_statistics()

    def _set_statistics(self) -> None:
        targets = np.array([g.target for g in self.train])
        edges = np.concatenate([g.edges.ravel() for g in self.train])
        object.__setattr__(self, "target_mean", float(targets.mean()))
        object.__setattr__(self, "target_std", float(targets.std()) or 1.0)
        object.__setattr__(self, "edge_mean", float(edges.mean()) if edges.size else 0.0)
        object.__setattr__(self, "edge_std", float(edges.std()) if edges.size else 1.0)
        if self.edge_std == 0.0:
            object.__setattr__(self, "edge_std", 1.0)

    @property
    def num_features(self) -> int:
        return int(self.train[0].nodes.shape[1])


_datasets: dict[str, Callable[..., Dataset]] = {}  # name -> builder(seed=..., **params)


def register_dataset(fn: Callable[..., Dataset]) -> Callable[..., Dataset]:
    """Register a data set builder under its function name."""
    _datasets[fn.__name__] = fn
    return fn


def dataset_parameters(name: str) -> dict[str, object]:
    """The keyword parameters of data set ``name`` with their defaults."""
    builder = _get_builder(name)
    return {
        p.name: p.default
        for p in inspect.signature(builder).parameters.values()
        if p.kind is inspect.Parameter.KEYWORD_ONLY
    }


def list_datasets() -> list[str]:
    return sorted(_datasets)


def load_dataset(name: str, *, allow_nonfinite: bool = False, **params: object) -> Dataset:
    """Build data set ``name`` with ``params`` (which must include ``seed``).

    A graph holding NaN or +-Inf is a ``DataError`` naming it and the field, unless
    ``allow_nonfinite``: then the runs record ``first_nan_where = "input"`` untrained.
    """
    builder = _get_builder(name)
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


def _get_builder(name: str) -> Callable[..., Dataset]:
    if name not in _datasets:
        raise NameNotFound("data set", name, _datasets)
    return _datasets[name]


@register_dataset
def synthetic(
    *,
    seed: int = 0,
    num_graphs: int = 2000,
    min_nodes: int = 6,
    max_nodes: int = 15,
    box: float = 5.0,
    min_distance: float = 0.5,
    cutoff: float = 4.0,
    num_types: int = 4,
    attend: str = "nearest",
    val_fraction: float = 0.1,
) -> Dataset:
    """Random 3-D point clouds whose target needs one neighbour singled out by distance.

    Node ``i`` has a random type among ``num_types`` (one-hot features). For each node, the
    neighbour within ``cutoff`` that is ``attend``-most ("farthest" or "nearest") contributes
    a fixed value of its type; the graph target is the sum over nodes. Points are at least
    ``min_distance`` apart, so ``e`` lies in [min_distance, cutoff).

    With "nearest", sharpening the attention drives Net's weight on ``e`` up, so every
    logit ``w * e`` of a node whose neighbours are all far heads below -87.3, where float32
    ``exp`` flushes to 0 and the naive softmax returns ``0 / 0``. With "farthest" the logits
    grow positive instead, towards the overflow at 88.72 (see README for what we measured).
    """
    if attend not in ("farthest", "nearest"):
        raise StabilityError(f"attend={attend!r} must be 'farthest' or 'nearest'")
    if not 1 <= min_nodes <= max_nodes:
        raise StabilityError(f"need 1 <= min_nodes <= max_nodes, got {min_nodes}, {max_nodes}")
    if not 0.0 < val_fraction < 1.0:
        raise StabilityError(f"val_fraction={val_fraction} must be in (0, 1)")
    rng = np.random.default_rng(seed)
    type_values = np.linspace(-1.5, 1.5, num_types)
    graphs = [
        _point_cloud_graph(
            rng,
            int(rng.integers(min_nodes, max_nodes + 1)),
            box,
            min_distance,
            cutoff,
            num_types,
            type_values,
            attend,
        )
        for _ in range(num_graphs)
    ]
    num_val = max(1, round(num_graphs * val_fraction))
    order = rng.permutation(num_graphs)
    key = (
        f"synthetic(seed={seed},num_graphs={num_graphs},nodes={min_nodes}-{max_nodes},"
        f"box={box:g},min_distance={min_distance:g},cutoff={cutoff:g},types={num_types},"
        f"attend={attend})"
    )
    return Dataset(
        key=key,
        train=[graphs[i] for i in order[num_val:]],
        val=[graphs[i] for i in order[:num_val]],
    )


def _point_cloud_graph(
    rng: np.random.Generator,
    num_nodes: int,
    box: float,
    min_distance: float,
    cutoff: float,
    num_types: int,
    type_values: np.ndarray,
    attend: str,
) -> Graph:
    points = _spaced_points(rng, num_nodes, box, min_distance)
    types = rng.integers(0, num_types, size=num_nodes)
    # [num_nodes, num_nodes] pairwise distances
    dist = np.linalg.norm(points[:, None, :] - points[None, :, :], axis=-1)
    adjacent = (dist < cutoff) & ~np.eye(num_nodes, dtype=bool)
    receivers, senders = np.nonzero(adjacent)
    # Non-neighbours get -inf/+inf so that argmax/argmin never picks them.
    if attend == "farthest":
        chosen = np.where(adjacent, dist, -np.inf).argmax(axis=1)
    else:
        chosen = np.where(adjacent, dist, np.inf).argmin(axis=1)
    has_neighbour = adjacent.any(axis=1)
    target = float(type_values[types[chosen]][has_neighbour].sum())
    return Graph(
        nodes=np.eye(num_types, dtype=np.float64)[types],
        edges=dist[receivers, senders].reshape(-1, 1),
        senders=senders.astype(np.int32),
        receivers=receivers.astype(np.int32),
        target=target,
    )


def _spaced_points(
    rng: np.random.Generator, num_nodes: int, box: float, min_distance: float
) -> np.ndarray:
    """``[num_nodes, 3]`` points in a cube of side ``box``, pairwise at least ``min_distance``."""
    points: list[np.ndarray] = []
    for _ in range(1000 * num_nodes):
        candidate = rng.uniform(0.0, box, size=3)
        if all(np.linalg.norm(candidate - p) >= min_distance for p in points):
            points.append(candidate)
            if len(points) == num_nodes:
                return np.array(points)
    raise StabilityError(
        f"cannot place {num_nodes} points {min_distance} apart in a box of side {box}"
    )


@register_dataset
def generated(
    *,
    seed: int = 0,
    num_graphs: int = 200,
    min_nodes: int = 6,
    max_nodes: int = 15,
    min_edges: int = 0,
    max_edges: int = 60,
    self_loops: bool = False,
    duplicate_edges: bool = False,
    num_types: int = 4,
    attend: str = "nearest",
    distribution: str = "any",
    min_distance: float = 0.5,
    max_distance: float = 4.0,
    max_outlier: float = 40.0,
    val_fraction: float = 0.1,
) -> Dataset:
    """Graphs drawn by ``stability.strategies.graphs``, reproducibly from ``seed``.

    ``distribution`` is one of ``stability.strategies.DISTRIBUTIONS`` or "any". The key
    (the CSV ``dataset`` column) is a call with every argument; ``dataset_from_key`` rebuilds
    the same graphs from it.
    """
    # Imported here: stability.strategies builds on this module's Dataset.
    from stability.strategies import generated_dataset

    args = dict(locals())
    del args["generated_dataset"]
    key = "generated(" + ",".join(f"{name}={value!r}" for name, value in args.items()) + ")"
    return generated_dataset(
        seed=seed,
        num_graphs=num_graphs,
        val_fraction=val_fraction,
        key=key,
        min_nodes=min_nodes,
        max_nodes=max_nodes,
        min_edges=min_edges,
        max_edges=max_edges,
        self_loops=self_loops,
        duplicate_edges=duplicate_edges,
        num_types=num_types,
        attend=attend,
        distribution=None if distribution == "any" else distribution,
        min_distance=min_distance,
        max_distance=max_distance,
        max_outlier=max_outlier,
    )


def dataset_from_key(key: str) -> Dataset:
    """Rebuild a data set from its key, for keys written as calls, like ``generated``'s."""
    try:
        call = ast.parse(key, mode="eval").body
        if not (isinstance(call, ast.Call) and isinstance(call.func, ast.Name)) or call.args:
            raise ValueError("not a call with keyword arguments")
        params = {kw.arg: ast.literal_eval(kw.value) for kw in call.keywords}
    except (SyntaxError, ValueError) as exc:
        raise StabilityError(
            f"data set key {key!r} cannot be rebuilt ({exc}); expected name(arg=value, ...)"
        ) from None
    return load_dataset(call.func.id, **params)


# Registers the molecular data sets (``g2``); at the end, since it imports this module.
from stability import molecules  # noqa: E402, F401
