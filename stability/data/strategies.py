"""Hypothesis strategies for the harness's inputs: edge distances, graphs and data sets.

The seed's edge feature ``e`` is a distance in [0.5, 4]. How fast a naive softmax overflows
depends on how those distances are spread, so the strategies vary the spread as well as the
values: uniform, log-uniform, clustered near a bound, or uniform with rare outliers beyond
the upper bound. Every strategy takes keyword-only ``min_*``/``max_*`` pairs whose defaults
derive from each other, and checks its arguments when it is built (``InvalidArgument``),
the way Hypothesis' own strategies do::

    from hypothesis import given
    from stability.data.strategies import datasets, graphs

    @given(datasets(graphs(max_distance=1e3), max_graphs=6))
    def test_my_variant(dataset): ...

``draw(strategy, seed=...)`` draws one value reproducibly outside a test; the runner uses it
to build the ``generated`` data set of a case.
"""

from __future__ import annotations

import math
from typing import Any, TypeVar

import numpy as np
from hypothesis import strategies as st
from hypothesis.errors import InvalidArgument
from hypothesis.extra.numpy import arrays

from stability.compat.hypothesis_engine import draw
from stability.core.errors import StabilityError
from stability.data.graphs import Graph
from stability.data.registry import Dataset

T = TypeVar("T")

#: The spreads ``edge_distances`` can draw; ``None`` means any of them.
DISTRIBUTIONS = ("uniform", "log_uniform", "clustered", "outliers")
#: ``clustered`` with its bound fixed instead of drawn: near ``min_value`` or ``max_value``.
#: Named only explicitly; ``None`` ("any") still draws from ``DISTRIBUTIONS``, so data sets
#: drawn before these names existed stay the same.
CLUSTERED_AT = {"clustered_low": "low", "clustered_high": "high"}
#: Every name ``distribution`` accepts.
NAMED_DISTRIBUTIONS = (*DISTRIBUTIONS, *CLUSTERED_AT)
ATTEND = ("nearest", "farthest")


def edge_distances(
    *,
    min_size: int = 0,
    max_size: int | None = None,
    min_value: float = 0.5,
    max_value: float = 4.0,
    distribution: str | None = None,
    max_outlier: float | None = None,
) -> st.SearchStrategy[np.ndarray]:
    """Edge distances, ``[num_edges]`` float64, ``min_size <= num_edges <= max_size``.

    Args:
        min_size, max_size: the number of distances; ``max_size`` defaults to
            ``min_size + 50``.
        min_value, max_value: the bounds of every distance but the outliers; [0.5, 4] is the
            seed's range.
        distribution: ``uniform``; ``log_uniform`` (needs ``min_value > 0``); ``clustered``
            (within a drawn width, at most a tenth of the range, of a drawn bound);
            ``clustered_low`` and ``clustered_high`` (the same, near that bound);
            ``outliers`` (uniform, plus between one and a tenth of the edges in
            ``[max_value, max_outlier]``); or ``None`` for any of them.
        max_outlier: the largest outlier; defaults to ``10 * max_value``.
    """
    max_size = min_size + 50 if max_size is None else max_size
    max_outlier = 10.0 * max_value if max_outlier is None else max_outlier
    _check_size("size", min_size, max_size)
    _check_bounds("value", min_value, max_value, lowest=0.0)
    if not math.isfinite(max_outlier) or max_outlier < max_value:
        raise InvalidArgument(f"max_outlier={max_outlier!r} must be finite and >= max_value")
    if distribution is not None and distribution not in NAMED_DISTRIBUTIONS:
        raise InvalidArgument(
            f"distribution={distribution!r} must be one of {', '.join(NAMED_DISTRIBUTIONS)} or None"
        )
    if distribution == "log_uniform" and min_value <= 0:
        raise InvalidArgument(f"distribution='log_uniform' needs min_value > 0, got {min_value!r}")
    if distribution is None:
        # log-uniform is undefined from 0; "any" then means the other three.
        names = [d for d in DISTRIBUTIONS if d != "log_uniform" or min_value > 0]
        chosen: st.SearchStrategy[str] = st.sampled_from(names)
    else:
        chosen = st.just(distribution)
    sizes = st.integers(min_size, max_size)
    return st.tuples(chosen, sizes).flatmap(
        lambda pair: _distances(pair[0], pair[1], min_value, max_value, max_outlier)
    )


def _array(size: int, elements: st.SearchStrategy[Any], dtype: Any = np.float64) -> Any:
    # fill=nothing() draws every element: arrays() would otherwise repeat one fill value
    # across most of the array, which is not a spread of distances.
    return arrays(dtype, size, elements=elements, fill=st.nothing())


def _distances(
    distribution: str, size: int, low: float, high: float, max_outlier: float
) -> st.SearchStrategy[np.ndarray]:
    if distribution == "log_uniform":
        logs = _array(size, st.floats(math.log(low), math.log(high)))
        # exp(log(high)) can round one ulp past high: clip back into the promised range.
        return logs.map(lambda a: np.clip(np.exp(a), low, high))
    uniform = _array(size, st.floats(low, high))
    if distribution == "clustered" or distribution in CLUSTERED_AT:
        side = CLUSTERED_AT.get(distribution)
        bound = (
            st.sampled_from([low, high])
            if side is None
            else st.just(low if side == "low" else high)
        )
        return st.builds(
            _clustered,
            bound,
            st.floats(0.0, 0.1),
            _array(size, st.floats(0.0, 1.0)),
            st.just((low, high)),
        )
    if distribution == "outliers" and size > 0:
        outliers = st.lists(
            st.tuples(st.integers(0, size - 1), st.floats(high, max_outlier)),
            min_size=1,
            max_size=max(1, size // 10),
        )
        return st.builds(_with_outliers, uniform, outliers)
    return uniform


def _clustered(
    bound: float, width: float, unit: np.ndarray, bounds: tuple[float, float]
) -> np.ndarray:
    low, high = bounds
    spread = width * (high - low) * unit
    return np.clip(low + spread if bound == low else high - spread, low, high)


def _with_outliers(values: np.ndarray, outliers: list[tuple[int, float]]) -> np.ndarray:
    values = values.copy()
    for index, value in outliers:
        values[index] = value
    return values


def graphs(
    *,
    min_nodes: int = 1,
    max_nodes: int | None = None,
    min_edges: int = 0,
    max_edges: int | None = None,
    self_loops: bool = False,
    duplicate_edges: bool = True,
    num_types: int = 4,
    attend: str = "nearest",
    min_distance: float = 0.5,
    max_distance: float = 4.0,
    distribution: str | None = None,
    max_outlier: float | None = None,
) -> st.SearchStrategy[Graph]:
    """Graphs of the synthetic data set's kind with drawn structure and drawn distances.

    Nodes carry one-hot types (``[num_nodes, num_types]``); each edge ``j -> i`` gets a
    distance from ``edge_distances``. Isolated nodes and graphs with no edges occur
    naturally (``min_edges=0``); ``duplicate_edges`` allows the same ``j -> i`` twice and
    ``self_loops`` allows ``i -> i``. The target is built as in ``datasets.synthetic``: for
    every node with an incoming edge, a value of the type of its ``attend``-most neighbour
    ("nearest" or "farthest" by distance), summed over the graph.

    ``max_nodes`` defaults to ``min_nodes + 14``, ``max_edges`` to ``min_edges + 60``;
    ``min_edges`` is met when the graph has room for it (without duplicates, a graph of
    ``n`` nodes has at most ``n * (n - 1)`` edges, ``n * n`` with self-loops).
    The distance arguments are those of ``edge_distances``.
    """
    max_nodes = min_nodes + 14 if max_nodes is None else max_nodes
    max_edges = min_edges + 60 if max_edges is None else max_edges
    _check_size("nodes", min_nodes, max_nodes, lowest=1)
    _check_size("edges", min_edges, max_edges)
    if not isinstance(num_types, int) or num_types < 1:
        raise InvalidArgument(f"num_types={num_types!r} must be an integer >= 1")
    if attend not in ATTEND:
        raise InvalidArgument(f"attend={attend!r} must be one of {', '.join(ATTEND)}")
    distance_args = {
        "min_value": min_distance,
        "max_value": max_distance,
        "distribution": distribution,
        "max_outlier": max_outlier,
    }
    edge_distances(**distance_args)  # checks the distance arguments now, not at draw time
    return _graph(
        nodes=st.integers(min_nodes, max_nodes),
        edges=(min_edges, max_edges),
        self_loops=self_loops,
        duplicate_edges=duplicate_edges,
        num_types=num_types,
        attend=attend,
        distance_args=distance_args,
    )


@st.composite
def _graph(
    draw: st.DrawFn,
    nodes: st.SearchStrategy[int],
    edges: tuple[int, int],
    self_loops: bool,
    duplicate_edges: bool,
    num_types: int,
    attend: str,
    distance_args: dict[str, Any],
) -> Graph:
    num_nodes = draw(nodes)
    pairs = [(i, j) for i in range(num_nodes) for j in range(num_nodes) if self_loops or i != j]
    min_edges, max_edges = edges
    if not duplicate_edges:
        max_edges = min(max_edges, len(pairs))
    min_edges = min(min_edges, max_edges) if pairs else 0
    # [num_edges] (receiver, sender) pairs
    chosen = (
        draw(
            st.lists(
                st.sampled_from(pairs),
                min_size=min_edges,
                max_size=max_edges,
                unique=not duplicate_edges,
            )
        )
        if pairs
        else []
    )
    num_edges = len(chosen)
    distances = draw(edge_distances(min_size=num_edges, max_size=num_edges, **distance_args))
    types = draw(_array(num_nodes, st.integers(0, num_types - 1), np.int64))
    receivers = np.array([r for r, _ in chosen], dtype=np.int32)
    senders = np.array([s for _, s in chosen], dtype=np.int32)
    return Graph(
        nodes=np.eye(num_types, dtype=np.float64)[types],
        edges=distances.reshape(-1, 1),
        senders=senders,
        receivers=receivers,
        target=attention_target(types, senders, receivers, distances, num_types, attend),
    )


def attention_target(
    types: np.ndarray,
    senders: np.ndarray,
    receivers: np.ndarray,
    distances: np.ndarray,
    num_types: int,
    attend: str = "nearest",
) -> float:
    """The synthetic target: over the nodes with an incoming edge, the sum of a fixed value of
    the type of each node's ``attend``-most sender by distance.

    Shapes: ``types`` ``[num_nodes]``; ``senders``, ``receivers``, ``distances``
    ``[num_edges]``. Ties go to the first such edge.
    """
    type_values = np.linspace(-1.5, 1.5, num_types)
    total = 0.0
    for node in np.unique(receivers):
        incoming = np.flatnonzero(receivers == node)
        pick = np.argmin if attend == "nearest" else np.argmax
        total += type_values[types[senders[incoming[pick(distances[incoming])]]]]
    return float(total)


def datasets(
    elements: st.SearchStrategy[Graph] | None = None,
    *,
    min_graphs: int = 2,
    max_graphs: int | None = None,
    val_fraction: float = 0.1,
    key: str = "hypothesis",
) -> st.SearchStrategy[Dataset]:
    """Data sets of ``min_graphs`` to ``max_graphs`` graphs drawn from ``elements``.

    The last ``max(1, round(val_fraction * K))`` of the K graphs are the validation split, as
    in ``datasets.synthetic``. ``elements`` defaults to ``graphs()``, ``max_graphs`` to
    ``min_graphs + 8``; ``key`` becomes ``Dataset.key``.
    """
    max_graphs = min_graphs + 8 if max_graphs is None else max_graphs
    _check_size("graphs", min_graphs, max_graphs, lowest=2)
    if not 0.0 < val_fraction < 1.0:
        raise InvalidArgument(f"val_fraction={val_fraction!r} must be in (0, 1)")
    elements = graphs() if elements is None else elements
    return st.lists(elements, min_size=min_graphs, max_size=max_graphs).map(
        lambda drawn: split_dataset(drawn, val_fraction, key)
    )


def split_dataset(graphs: list[Graph], val_fraction: float, key: str | None = None) -> Dataset:
    """A ``Dataset`` whose last ``max(1, round(val_fraction * len(graphs)))`` graphs validate;
    without a ``key``, one that ``load_dataset`` keys."""
    num_val = min(len(graphs) - 1, max(1, round(len(graphs) * val_fraction)))
    return Dataset(key=key, train=graphs[:-num_val], val=graphs[-num_val:])


def generated_dataset(
    *,
    seed: int,
    num_graphs: int,
    val_fraction: float,
    **graph_args: Any,
) -> Dataset:
    """``num_graphs`` graphs of ``graphs(**graph_args)``, graph ``i`` drawn with seed
    ``"{seed}/{i}"``, split as in ``datasets``, for ``load_dataset`` to key. Bad arguments
    raise ``StabilityError``."""
    try:
        strategy = graphs(**graph_args)
    except InvalidArgument as exc:
        raise StabilityError(f"data set generated: {exc}") from None
    drawn = [draw(strategy, seed=f"{seed}/{i}") for i in range(num_graphs)]
    return split_dataset(drawn, val_fraction)


def _check_size(name: str, low: int, high: int, lowest: int = 0) -> None:
    for arg, value in ((f"min_{name}", low), (f"max_{name}", high)):
        if not isinstance(value, int) or isinstance(value, bool) or value < lowest:
            raise InvalidArgument(f"{arg}={value!r} must be an integer >= {lowest}")
    if low > high:
        raise InvalidArgument(f"min_{name}={low!r} must be <= max_{name}={high!r}")


def _check_bounds(name: str, low: float, high: float, lowest: float) -> None:
    for arg, value in ((f"min_{name}", low), (f"max_{name}", high)):
        if not isinstance(value, (int, float)) or not math.isfinite(value) or value < lowest:
            raise InvalidArgument(f"{arg}={value!r} must be a finite number >= {lowest}")
    if low > high:
        raise InvalidArgument(f"min_{name}={low!r} must be <= max_{name}={high!r}")
