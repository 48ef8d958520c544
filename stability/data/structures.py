"""Your own molecules or crystals: the ``structures`` data set reads any file ASE reads
(extxyz, xyz, traj, an ASE database, CIF, ...) into graphs.

Named ``structures`` because that is what such a file holds, whatever its format (``ase``
is how it is read, not what it is). ASE is an optional extra:
``pip install "stability[molecules]"``.

Every error names the file and the structure by its index in the file.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from stability.core.errors import DataError, StabilityError
from stability.data.graphs import Graph
from stability.data.registry import Dataset, register_dataset

#: How many hex digits of the file's SHA-256 the data set key carries: enough that a changed
#: file gets a different key (so ``--resume`` and ``compare`` notice), short enough to read.
DIGEST_CHARS = 12

_INDEX = re.compile(r"^\s*(-?\d+)?\s*(?::\s*(-?\d+)?\s*(?::\s*(-?\d+)?\s*)?)?$")


def file_facts(arguments: Mapping[str, object]) -> dict[str, object]:
    """How a key names the file at ``arguments["path"]``: by its name, so that the key is the
    same wherever the folder is, and by the SHA-256 of its bytes, so that a changed file
    gets another key."""
    file = Path(str(arguments["path"]))
    return {"path": file.name, "sha256": file_digest(file)}


@register_dataset(key_facts=file_facts)
def structures(
    *,
    path: str = "",
    target: str = "energy",
    cutoff: float = 4.0,
    index: str = ":",
    format: str = "",
    seed: int = 0,
    val_fraction: float = 0.2,
) -> Dataset:
    """Structures from the file at ``path`` (relative to the case file), one graph each.

    Nodes are atoms: a one-hot of the element over the elements present in the file (in
    order of atomic number) plus Z / 10. An edge each way joins every pair of atoms closer
    than ``cutoff`` Angstrom (ASE's ``neighbor_list``; periodic cells are honoured, so an
    atom may neighbour another's image); ``e`` is their distance. The target is the
    structure's ``info[target]`` or its calculator's ``target`` property (``energy`` in an
    extxyz header lands there). ``index`` picks structures as in Python (``"0:100"``,
    ``"::2"``, ``"5"``); ``format`` forces ASE's format name when the file name does not say
    it. The split is by structure: ``val_fraction`` of them drawn with ``seed``.

    An atom with no other atom within ``cutoff`` is kept, as a node no edge enters, and a
    structure with no pair within it (a single atom, say) as a graph without edges: the
    data set counts both (``Dataset.isolated_nodes``, ``Dataset.graphs_without_edges``) and
    carries the ``cutoff``, so a report can say what the cutoff left out.
    """
    if not path:
        raise DataError("data set structures: set dataset.path to a structure file ASE reads")
    if cutoff <= 0:
        raise DataError(f"data set structures: cutoff={cutoff} must be positive")
    file = Path(path)
    selection = _parse_index(index)
    atoms_list, numbering = _read(file, selection, format or None)
    elements = sorted({int(z) for atoms in atoms_list for z in atoms.numbers})
    graphs = [
        _structure_graph(atoms, elements, cutoff, target, file, number)
        for atoms, number in zip(atoms_list, numbering, strict=True)
    ]
    if len(graphs) < 2:
        raise DataError(f"{file}: needs at least 2 structures to split, found {len(graphs)}")
    return Dataset.split(graphs, seed=seed, val_fraction=val_fraction, cutoff=cutoff)


def file_digest(path: Path) -> str:
    """The first ``DIGEST_CHARS`` hex digits of the SHA-256 of the file's bytes."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()[:DIGEST_CHARS]


def _parse_index(index: str) -> slice:
    match = _INDEX.match(index)
    if not index.strip() or match is None:
        raise DataError(
            f"data set structures: index={index!r} is not valid; expected a Python index or "
            "slice such as '5', '0:100' or '::2'"
        )
    start, stop, step = (int(g) if g is not None else None for g in match.groups())
    if ":" not in index:  # a single structure
        return slice(start, None if start == -1 else start + 1)
    if step == 0:
        raise DataError("data set structures: index step must not be 0")
    return slice(start, stop, step)


def _read(file: Path, selection: slice, format: str | None) -> tuple[list[Any], list[int]]:
    """The selected structures of ``file`` and their indices in the file."""
    try:
        import ase.io
    except ImportError:
        raise StabilityError(
            "data set 'structures' needs ASE, which is not installed: "
            'pip install "stability[molecules]" (or: pip install ase)'
        ) from None
    if not file.is_file():
        raise DataError(f"{file}: no such structure file")
    try:
        # The whole file, then the slice here: so each structure's index in the file is known.
        everything = ase.io.read(file, index=":", format=format)
    except Exception as exc:  # ASE raises many types for a file it cannot parse
        kind = f"as format {format!r}" if format else "as any format ASE knows"
        raise DataError(
            f"{file}: cannot read it {kind} ({type(exc).__name__}: {exc}); "
            "set dataset.format to one of ASE's format names (ase.io.formats)"
        ) from None
    numbering = list(range(len(everything)))[selection]
    if not numbering:
        raise DataError(f"{file}: no structure in it (index selects none of {len(everything)})")
    return [everything[i] for i in numbering], numbering


def _structure_graph(
    atoms: Any, elements: list[int], cutoff: float, target: str, file: Path, number: int
) -> Graph:
    from ase.neighborlist import neighbor_list

    where = f"{file}: structure {number} ({atoms.get_chemical_formula()})"
    if not np.isfinite(atoms.positions).all():
        raise DataError(f"{where}: positions hold NaN or Inf")
    value = _target(atoms, target, where)
    # Receivers i, senders j, distances d: one entry per ordered pair within cutoff
    # (both directions), found by binning, not by a Python double loop. None for a
    # structure whose atoms are all farther apart: a graph without edges.
    receivers, senders, distances = neighbor_list("ijd", atoms, cutoff)
    column = np.searchsorted(elements, atoms.numbers)
    # [num_atoms, len(elements) + 1]: element one-hot, then Z / 10 (kept near 1 in size)
    nodes = np.concatenate([np.eye(len(elements))[column], (atoms.numbers / 10.0)[:, None]], axis=1)
    return Graph(
        nodes=nodes,
        edges=np.asarray(distances, dtype=np.float64).reshape(-1, 1),
        senders=senders.astype(np.int32),
        receivers=receivers.astype(np.int32),
        target=value,
        source_index=number,
    )


def _target(atoms: Any, target: str, where: str) -> float:
    value = atoms.info.get(target)
    if value is None and atoms.calc is not None:
        try:
            value = atoms.calc.get_property(target, atoms, allow_calculation=False)
        except Exception:  # a property name the calculator does not know
            value = None
    if value is None:
        known = sorted(atoms.info) + (sorted(atoms.calc.results) if atoms.calc else [])
        raise DataError(
            f"{where}: has no target {target!r} (neither an info key nor a calculator "
            f"property); it has: {', '.join(known) or 'none'}"
        )
    array = np.asarray(value, dtype=np.float64)
    if array.size != 1:
        raise DataError(f"{where}: target {target!r} has {array.size} values; expected one")
    return float(array.reshape(()))
