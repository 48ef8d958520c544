"""The ``synthetic`` data set: the seed's setting from random 3-D points.

The seed's edge feature ``e`` is a distance in [0.5, 4]. ``synthetic`` builds graphs from
random 3-D points, one edge each way for every pair closer than ``cutoff``, and a target
that can only be fitted well by an attention that singles out one neighbour by its
distance. That pressure is what grows the attention logits in the seed's story.
"""

from __future__ import annotations

import numpy as np

from stability.core.errors import StabilityError
from stability.data.graphs import Graph
from stability.data.registry import Dataset, register_dataset


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
    grow positive instead, towards the overflow at 88.72 (docs/findings.md says what we measured).
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
    return Dataset(
        train=[graphs[i] for i in order[num_val:]],
        val=[graphs[i] for i in order[:num_val]],
        cutoff=cutoff,
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
