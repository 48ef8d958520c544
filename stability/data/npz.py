"""Graphs from a file: the ``npz`` data set reads, and ``save_graphs`` writes, a NumPy
``.npz`` holding many graphs in jraph's ``GraphsTuple`` layout (all graphs concatenated).

Arrays (``N`` = all nodes, ``E`` = all edges, ``G`` = graphs):

- ``nodes``: ``[N, num_features]`` float node features;
- ``edges``: ``[E]`` or ``[E, 1]`` float, the edge distance ``e`` (>= 0);
- ``senders``, ``receivers``: ``[E]`` int, indices into ``nodes`` (the whole file's nodes,
  as in jraph: graph k's first node is ``sum(n_node[:k])``);
- ``n_node``, ``n_edge``: ``[G]`` int, each graph's node and edge counts;
- ``targets`` (or jraph's ``globals``): ``[G]`` or ``[G, 1]`` float, one target per graph.

Graphs are named by their index in the file in every error.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np

from stability.core.errors import DataError
from stability.data.graphs import Graph
from stability.data.registry import Dataset, register_dataset
from stability.data.structures import file_facts

#: The arrays every file holds, besides ``targets`` (or ``globals``).
ARRAYS = ("nodes", "edges", "senders", "receivers", "n_node", "n_edge")


def save_graphs(graphs: Sequence[Graph], path: str | Path) -> Path:
    """Write ``graphs`` to ``path`` (an ``.npz``, zip-compressed) in the layout the ``npz``
    data set reads."""
    if not graphs:
        raise DataError(f"{path}: no graphs to write")
    n_node = np.array([g.num_nodes for g in graphs], dtype=np.int64)
    n_edge = np.array([g.num_edges for g in graphs], dtype=np.int64)
    # jraph numbers nodes across the whole tuple: shift each graph's endpoints.
    offsets = np.repeat(np.cumsum(n_node) - n_node, n_edge)
    path = Path(path)
    # Compressed: one-hot nodes and sorted endpoints shrink to about a quarter.
    np.savez_compressed(
        path,
        nodes=np.concatenate([g.nodes for g in graphs]),
        edges=np.concatenate([g.edges.reshape(-1) for g in graphs]),
        senders=np.concatenate([g.senders for g in graphs]).astype(np.int64) + offsets,
        receivers=np.concatenate([g.receivers for g in graphs]).astype(np.int64) + offsets,
        n_node=n_node,
        n_edge=n_edge,
        targets=np.array([g.target for g in graphs], dtype=np.float64),
    )
    # np.savez appends .npz to a name without it.
    return path if path.suffix == ".npz" else path.with_name(path.name + ".npz")


@register_dataset(key_facts=file_facts)
def npz(*, path: str = "", seed: int = 0, val_fraction: float = 0.2) -> Dataset:
    """Graphs from a ``.npz`` in jraph's GraphsTuple layout (``stability.data.npz``), split
    by graph: ``val_fraction`` of them drawn with ``seed``."""
    if not path:
        raise DataError("data set npz: set dataset.path to a .npz file (docs/plugins.md)")
    graphs = read_graphs(Path(path))
    return Dataset.split(graphs, seed=seed, val_fraction=val_fraction)


def read_graphs(file: Path) -> list[Graph]:
    """The graphs in ``file``, each with its index in the file as ``source_index``."""
    arrays = _load(file)
    n_node, n_edge = arrays["n_node"], arrays["n_edge"]
    nodes, edges = arrays["nodes"], arrays["edges"].reshape(-1, 1)
    targets = arrays["targets"].reshape(-1)
    if not (len(n_node) == len(n_edge) == len(targets)):
        raise DataError(
            f"{file}: n_node, n_edge and targets must have one entry per graph, got "
            f"{len(n_node)}, {len(n_edge)} and {len(targets)}"
        )
    if n_node.sum() != len(nodes) or n_edge.sum() != len(edges):
        raise DataError(
            f"{file}: n_node sums to {n_node.sum()} and n_edge to {n_edge.sum()}, but there are "
            f"{len(nodes)} nodes and {len(edges)} edges"
        )
    node_start = np.cumsum(n_node) - n_node
    edge_start = np.cumsum(n_edge) - n_edge
    graphs = []
    for k in range(len(n_node)):
        edge_slice = slice(edge_start[k], edge_start[k] + n_edge[k])
        senders = arrays["senders"][edge_slice] - node_start[k]
        receivers = arrays["receivers"][edge_slice] - node_start[k]
        for name, ends in (("senders", senders), ("receivers", receivers)):
            if ends.size and (ends.min() < 0 or ends.max() >= n_node[k]):
                raise DataError(
                    f"{file}: graph {k}: {name} point outside its own {n_node[k]} nodes "
                    "(senders and receivers index the whole file's nodes, as in jraph)"
                )
        graphs.append(
            Graph(
                nodes=nodes[node_start[k] : node_start[k] + n_node[k]],
                edges=edges[edge_slice],
                senders=senders.astype(np.int32),
                receivers=receivers.astype(np.int32),
                target=float(targets[k]),
                source_index=k,
            )
        )
    return graphs


def _load(file: Path) -> dict[str, np.ndarray]:
    if not file.is_file():
        raise DataError(f"{file}: no such .npz file")
    try:
        with np.load(file, allow_pickle=False) as data:
            arrays = {name: data[name] for name in data.files}
    except Exception as exc:  # not a zip, a truncated file, a pickled object array
        raise DataError(f"{file}: cannot read it as .npz ({type(exc).__name__}: {exc})") from None
    if "targets" not in arrays and "globals" in arrays:
        arrays["targets"] = arrays["globals"]
    missing = [name for name in (*ARRAYS, "targets") if name not in arrays]
    if missing:
        raise DataError(
            f"{file}: lacks the arrays {', '.join(missing)}; expected "
            f"{', '.join(ARRAYS)} and targets (or globals), see stability.data.npz"
        )
    if arrays["nodes"].ndim != 2:
        raise DataError(f"{file}: nodes must be [num_nodes, features], got {arrays['nodes'].shape}")
    return arrays
