"""Real molecular geometries: the G2 collection that ASE ships (offline, in the package).

The seed's edge feature is an interatomic distance between 0.5 and 4; this is that
setting on real molecules. ASE is an optional extra: ``pip install "stability[molecules]"``.
"""

from __future__ import annotations

import numpy as np

from stability.core.errors import StabilityError
from stability.data.graphs import Graph
from stability.data.registry import Dataset, register_dataset

#: The elements of G2, in order of atomic number; a node's one-hot features use this order.
G2_ELEMENTS = ("H", "Li", "Be", "B", "C", "N", "O", "F", "Na", "Al", "Si", "P", "S", "Cl")


def _ase():
    try:
        from ase.collections import g2
        from ase.data import g2_1, g2_2
    except ImportError:
        raise StabilityError(
            "data set 'g2' needs ASE, which is not installed: "
            'pip install "stability[molecules]" (or: pip install ase)'
        ) from None
    return g2, {**g2_1.data, **g2_2.data}


@register_dataset
def g2(
    *,
    seed: int = 0,
    cutoff: float = 4.0,
    val_fraction: float = 0.2,
    perturbed_copies: int = 0,
    displacement: float = 0.02,
) -> Dataset:
    """The 148 molecules of G2 (its 14 single atoms are dropped: they have no edges).

    Nodes are atoms: a one-hot of the element over ``G2_ELEMENTS`` plus the atomic number
    / 10. An edge each way joins every pair of atoms closer than ``cutoff`` Angstrom; ``e``
    is their distance. The target is the standard enthalpy of formation at 298 K in
    kcal/mol, ASE's ``enthalpy`` field of ``ase.data.g2_1``/``g2_2``.

    The split is by molecule (``val_fraction`` of them, drawn with ``seed``). Each training
    molecule may get ``perturbed_copies`` extra copies whose atoms are displaced by Gaussian
    noise of ``displacement`` Angstrom (the target kept): more steps per epoch, and distances
    that are not exactly the equilibrium ones.
    """
    if cutoff <= 0:
        raise StabilityError(f"g2: cutoff={cutoff} must be positive")
    if not 0.0 < val_fraction < 1.0:
        raise StabilityError(f"g2: val_fraction={val_fraction} must be in (0, 1)")
    if perturbed_copies < 0 or displacement < 0:
        raise StabilityError("g2: perturbed_copies and displacement must not be negative")
    collection, reference = _ase()
    names = [name for name in collection.names if len(collection[name]) > 1]
    rng = np.random.default_rng(seed)
    order = rng.permutation(len(names))
    num_val = max(1, round(len(names) * val_fraction))
    val_names = [names[i] for i in order[:num_val]]
    train_names = [names[i] for i in order[num_val:]]
    train = []
    for name in train_names:
        atoms = collection[name]
        target = float(reference[name]["enthalpy"])
        train.append(_molecule_graph(atoms.numbers, atoms.positions, cutoff, target))
        for _ in range(perturbed_copies):
            moved = atoms.positions + rng.normal(scale=displacement, size=atoms.positions.shape)
            train.append(_molecule_graph(atoms.numbers, moved, cutoff, target))
    val = [
        _molecule_graph(
            collection[n].numbers, collection[n].positions, cutoff, reference[n]["enthalpy"]
        )
        for n in val_names
    ]
    return Dataset(train=train, val=val, cutoff=cutoff)


def _molecule_graph(
    numbers: np.ndarray, positions: np.ndarray, cutoff: float, target: float
) -> Graph:
    from ase.data import chemical_symbols

    index = [G2_ELEMENTS.index(chemical_symbols[z]) for z in numbers]
    # [num_atoms, len(G2_ELEMENTS) + 1]: element one-hot, then Z / 10 (kept near 1 in size)
    nodes = np.concatenate(
        [np.eye(len(G2_ELEMENTS))[index], (np.asarray(numbers) / 10.0)[:, None]], axis=1
    )
    # [num_atoms, num_atoms] pairwise distances
    dist = np.linalg.norm(positions[:, None, :] - positions[None, :, :], axis=-1)
    adjacent = (dist < cutoff) & ~np.eye(len(numbers), dtype=bool)
    receivers, senders = np.nonzero(adjacent)
    return Graph(
        nodes=nodes,
        edges=dist[receivers, senders].reshape(-1, 1),
        senders=senders.astype(np.int32),
        receivers=receivers.astype(np.int32),
        target=float(target),
    )
