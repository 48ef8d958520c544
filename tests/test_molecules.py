"""The G2 data set loads offline from the installed ASE package."""

import sys

import numpy as np
import pytest

from stability.core.errors import StabilityError
from stability.data import load_dataset

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
