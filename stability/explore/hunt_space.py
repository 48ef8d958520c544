"""The graph data a hunt may search: what a case's data set allows, and the moves within it.

A case built on the ``synthetic`` or ``generated`` data set bounds its edge distances (the
seed's [0.5, 4)), its node count and its node types, and defines the target by a rule (the
type of each node's nearest or farthest neighbour, ``strategies.attention_target``). The
hunt searches that space: any distances within the bounds, any structure (degree, isolated
nodes, graphs without edges, duplicate edges; no self-loops), with the target recomputed
by the case's rule after every move, so a found data set is one the case could have drawn.
The distances need not be those of points in space, as in ``generated``'s draws.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from stability.compat.hypothesis_engine import draw
from stability.core.errors import StabilityError
from stability.data import Dataset, load_dataset
from stability.data.graphs import Graph
from stability.data.strategies import attention_target, graphs
from stability.sweep.cases import Case

#: The data sets whose space a hunt knows.
SPACES = ("synthetic", "generated")


@dataclass(frozen=True)
class HuntSpace:
    """Bounds of the data a hunt may try (from the case's ``[dataset]``)."""

    dataset: str
    params: dict[str, Any]
    min_distance: float
    max_distance: float
    min_nodes: int
    max_nodes: int
    max_edges: int
    num_types: int
    attend: str
    num_graphs: int
    val_fraction: float

    @classmethod
    def of_case(cls, case: Case, num_graphs: int | None = None) -> HuntSpace:
        """The space of ``case``'s data set, with ``num_graphs`` graphs (default: the case's)."""
        if case.dataset not in SPACES:
            raise StabilityError(
                f"case {case.name}: hunt searches the data of the {' or '.join(SPACES)} data "
                f"sets, whose bounds and target rule it knows; this case uses {case.dataset!r}"
            )
        params = {**_defaults(case.dataset), **case.dataset_params}
        if num_graphs is not None:
            params["num_graphs"] = num_graphs
        if params["num_graphs"] < 2:
            raise StabilityError(f"--graphs {params['num_graphs']}: a hunt needs at least 2")
        synthetic = case.dataset == "synthetic"
        # synthetic's distances lie in [min_distance, cutoff): stay one ulp below the cutoff.
        top = (
            float(np.nextafter(params["cutoff"], 0.0))
            if synthetic
            else max(params["max_distance"], _outlier_top(params))
        )
        return cls(
            dataset=case.dataset,
            params=params,
            min_distance=float(params["min_distance"]),
            max_distance=top,
            min_nodes=int(params["min_nodes"]),
            max_nodes=int(params["max_nodes"]),
            max_edges=(
                params["max_nodes"] * (params["max_nodes"] - 1)
                if synthetic
                else int(params["max_edges"])
            ),
            num_types=int(params["num_types"]),
            attend=str(params["attend"]),
            num_graphs=int(params["num_graphs"]),
            val_fraction=float(params["val_fraction"]),
        )

    @property
    def log_range(self) -> float:
        """log(max / min) of the distances: the scale of a step in log distance."""
        return math.log(self.max_distance / max(self.min_distance, 1e-12))

    def start(self) -> list[Graph]:
        """The case's own data (its first data set), with the hunt's number of graphs."""
        data = load_dataset(self.dataset, **self.params)
        return [replace(g, source_index=None) for g in data.train + data.val]

    def plain(self, seed: int, index: int) -> list[Graph]:
        """Data set ``index`` of Hypothesis' plain generation of this space: every graph drawn
        by ``strategies.graphs`` over the same bounds and structure, spread ``any``."""
        strategy = graphs(
            min_nodes=self.min_nodes,
            max_nodes=self.max_nodes,
            max_edges=self.max_edges,
            duplicate_edges=True,
            num_types=self.num_types,
            attend=self.attend,
            min_distance=self.min_distance,
            max_distance=self.max_distance,
            max_outlier=self.max_distance,
        )
        return [draw(strategy, seed=f"hunt/{seed}/{index}/{i}") for i in range(self.num_graphs)]

    def dataset_of(self, graphs: Sequence[Graph], label: str) -> Dataset:
        """The data set a case on the written ``.npz`` builds: split as the ``npz`` reader
        splits (``Dataset.from_graphs``, seed 0), so the hunt trains what ``run`` will."""
        return Dataset.from_graphs(label, list(graphs), seed=0, val_fraction=self.val_fraction)

    def relabel(self, graph: Graph, distances: np.ndarray, keep: np.ndarray | None = None) -> Graph:
        """``graph`` with ``distances`` (``[num_edges]``, clipped into the bounds), only the
        edges ``keep`` (a ``[num_edges]`` bool, default all), and its target by the rule."""
        keep = np.ones(graph.num_edges, bool) if keep is None else keep
        values = np.clip(distances, self.min_distance, self.max_distance)[keep]
        senders, receivers = graph.senders[keep], graph.receivers[keep]
        types = graph.nodes.argmax(axis=1)
        return Graph(
            nodes=graph.nodes,
            edges=values.reshape(-1, 1).astype(np.float64),
            senders=senders,
            receivers=receivers,
            target=attention_target(types, senders, receivers, values, self.num_types, self.attend),
        )


def _defaults(name: str) -> dict[str, Any]:
    from stability.data import dataset_parameters

    return dict(dataset_parameters(name))


def _outlier_top(params: dict[str, Any]) -> float:
    """``generated`` draws outliers up to ``max_outlier`` only under ``outliers`` or ``any``."""
    if params.get("distribution", "any") in ("outliers", "any"):
        return float(params["max_outlier"])
    return float(params["max_distance"])


def graph_statistics(graphs: Sequence[Graph], space: HuntSpace) -> dict[str, float]:
    """What a data set looks like: its distances, in-degrees and structure."""
    distances = np.concatenate([g.edges.reshape(-1) for g in graphs]) if graphs else np.zeros(0)
    degrees, isolated, duplicates, nearest, gaps = [], 0, 0, [], []
    for g in graphs:
        counts = np.bincount(g.receivers, minlength=g.num_nodes)
        degrees.extend(counts[counts > 0].tolist())
        d = g.edges.reshape(-1)
        for node in np.flatnonzero(counts):
            # The attention's task at this node: its nearest neighbour, and by how much.
            incoming = np.sort(d[g.receivers == node])
            nearest.append(incoming[0])
            if incoming.size > 1:
                gaps.append(incoming[1] - incoming[0])
        isolated += int((counts == 0).sum())
        pairs = set(zip(g.receivers.tolist(), g.senders.tolist(), strict=True))
        duplicates += g.num_edges - len(pairs)
    near_top = space.max_distance - 0.05 * (space.max_distance - space.min_distance)
    return {
        "graphs": len(graphs),
        "edges": int(distances.size),
        "distance_min": float(distances.min()) if distances.size else math.nan,
        "distance_median": float(np.median(distances)) if distances.size else math.nan,
        "distance_max": float(distances.max()) if distances.size else math.nan,
        "share_near_top": float((distances >= near_top).mean()) if distances.size else math.nan,
        "nearest_median": float(np.median(nearest)) if nearest else math.nan,
        "nearest_gap_median": float(np.median(gaps)) if gaps else math.nan,
        "in_degree_mean": float(np.mean(degrees)) if degrees else math.nan,
        "in_degree_max": int(max(degrees)) if degrees else 0,
        "isolated_nodes": isolated,
        "graphs_without_edges": sum(g.num_edges == 0 for g in graphs),
        "duplicate_edges": duplicates,
    }
