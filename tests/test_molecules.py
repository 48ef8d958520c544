"""The G2 data set loads offline from the installed ASE package."""

import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from stability.core.errors import StabilityError
from stability.data import load_dataset
from stability.sweep.cases import load_case

ROOT = Path(__file__).resolve().parent.parent

pytest.importorskip("ase")


def test_g2_loads_every_molecule_with_finite_targets_and_distances_in_range():
    data = load_dataset("g2", seed=0, cutoff=4.0)
    graphs = data.train + data.val
    assert len(graphs) == 148, "G2 has 148 molecules once its 14 single atoms are dropped"
    assert len(data.val) == round(148 * 0.2)
    edges = np.concatenate([g.edges.ravel() for g in graphs])
    assert edges.min() > 0.0 and edges.max() <= 4.0
    assert np.isfinite([g.target for g in graphs]).all()


def test_g2_split_is_fixed_and_perturbed_copies_only_train():
    a = load_dataset("g2", seed=0)
    b = load_dataset("g2", seed=0, perturbed_copies=2)
    assert [g.target for g in a.val] == [g.target for g in b.val]
    assert len(b.train) == 3 * len(a.train)
    moved = b.train[1].edges.ravel() - b.train[0].edges.ravel()
    assert 0 < np.abs(moved).max() < 0.2, "a copy must be slightly displaced"


def test_without_ase_the_error_says_how_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "ase.collections", None)
    with pytest.raises(StabilityError, match=r'pip install "stability\[molecules\]"'):
        load_dataset("g2", seed=0)


def test_g2_says_what_its_cutoff_kept():
    """G2's molecules (its single atoms dropped) have no isolated atom within 4 A."""
    from ase.collections import g2

    data = load_dataset("g2", seed=0, cutoff=4.0)
    graphs = data.train + data.val
    edges = np.concatenate([g.edges.ravel() for g in graphs])
    assert (data.num_train_graphs, data.num_val_graphs) == (len(data.train), len(data.val))
    assert data.num_edges == edges.size
    assert (data.edge_min, data.edge_max) == (edges.min(), edges.max())
    assert data.cutoff == 4.0 > data.edge_max
    molecules = [g2[name] for name in g2.names if len(g2[name]) > 1]
    alone = sum(int((np.sort(a.get_all_distances(), axis=1)[:, 1] >= 4.0).sum()) for a in molecules)
    assert data.isolated_nodes == alone
    assert data.graphs_without_edges == 0


def test_g2_keys_are_those_of_the_committed_rows():
    """The data set's facts are new fields; its key, which ``--resume`` matches rows by, is
    the one the committed report was trained under."""
    case = load_case(ROOT / "cases" / "g2_molecules.toml")
    data = load_dataset(case.dataset, **{"seed": 0, **case.dataset_params})
    committed = pd.read_csv(ROOT / "reports" / "g2_molecules.csv")["dataset"]
    assert set(committed) == {data.key}
