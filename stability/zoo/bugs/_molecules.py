"""The zoo's small molecules: atoms drawn by a bug's data set, made into a graph.

Several bug programs train on small random molecules. Each draws its own atoms (their
positions and elements, in its own order of random draws, which fixes its graphs); this
module turns them into the graph every one of them trains on. Plain NumPy: no ASE.
"""

from __future__ import annotations

import numpy as np

from stability.data.graphs import Graph


def molecule_graph(
    positions: np.ndarray,
    elements: np.ndarray,
    cutoff: float,
    *,
    num_elements: int = 3,
    positions_in_nodes: bool = False,
) -> Graph:
    """Atoms at ``positions`` ``[num_atoms, 3]`` (Angstrom) of ``elements`` ``[num_atoms]``
    (indices into ``num_elements`` elements), an edge each way for every pair closer than
    ``cutoff``, ``e`` their distance ``[num_edges, 1]``.

    Nodes: a one-hot of the element, ``[num_atoms, num_elements]``, then the position where
    ``positions_in_nodes`` (``[num_atoms, num_elements + 3]``). Target: the number of bonds
    (pairs joined) plus the atoms' element indices.
    """
    # [num_atoms, num_atoms] pairwise distances
    dist = np.linalg.norm(positions[:, None] - positions[None], axis=-1)
    senders, receivers = np.nonzero((dist < cutoff) & ~np.eye(len(positions), dtype=bool))
    one_hot = np.eye(num_elements)[elements]
    return Graph(
        nodes=np.hstack([one_hot, positions]) if positions_in_nodes else one_hot,
        edges=dist[senders, receivers][:, None],
        senders=senders.astype(np.int32),
        receivers=receivers.astype(np.int32),
        target=float(len(senders) / 2 + elements.sum()),
    )
