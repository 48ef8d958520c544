"""Molecules and graphs from the user's own files: the ``structures`` and ``npz`` data sets."""

import numpy as np
import pytest

pytest.importorskip("ase")

import ase.io
from ase import Atoms
from ase.build import bulk
from ase.calculators.singlepoint import SinglePointCalculator
from ase.collections import g2

from stability import save_graphs
from stability.core.errors import DataError
from stability.data import load_dataset
from stability.data.npz import read_graphs
from stability.sweep.cases import parse_case

NAMES = ["H2O", "CH4", "NH3", "C2H6", "CO2", "HCN", "CH3OH", "C2H2"]


def molecules(energy_in="info"):
    """A few G2 molecules with a made-up target: their number of atoms times -1.5."""
    out = []
    for name in NAMES:
        atoms = g2[name]
        value = -1.5 * len(atoms)
        if energy_in == "info":
            atoms.info["energy_kcal"] = value
        else:
            atoms.calc = SinglePointCalculator(atoms, energy=value)
        out.append(atoms)
    return out


def write(path, atoms_list, **kwargs):
    ase.io.write(path, atoms_list, **kwargs)
    return str(path)


def test_an_info_key_becomes_the_target_and_graphs_carry_their_file_index(tmp_path):
    path = write(tmp_path / "m.extxyz", molecules())
    data = load_dataset("structures", path=path, target="energy_kcal", seed=0)
    graphs = data.train + data.val
    assert sorted(g.source_index for g in graphs) == list(range(len(NAMES)))
    for graph in graphs:
        atoms = g2[NAMES[graph.source_index]]
        assert graph.target == -1.5 * len(atoms)
        assert graph.num_nodes == len(atoms)
        # Elements present: C, H, N, O -> a 4-wide one-hot plus Z / 10.
        assert graph.nodes.shape == (len(atoms), 5)
        np.testing.assert_allclose(graph.nodes[:, -1], atoms.numbers / 10.0)
        # Each edge's e is the distance between its two atoms, both directions present.
        distances = atoms.get_all_distances()
        np.testing.assert_allclose(
            graph.edges[:, 0], distances[graph.receivers, graph.senders], rtol=1e-6
        )
        assert graph.num_edges == int(((distances < 4.0) & (distances > 0)).sum())


def test_a_calculator_energy_is_a_target_too(tmp_path):
    path = write(tmp_path / "m.traj", molecules(energy_in="calc"))
    data = load_dataset("structures", path=path, target="energy", seed=0)
    assert sorted(g.target for g in data.train + data.val) == sorted(
        -1.5 * len(g2[n]) for n in NAMES
    )


def test_an_ase_database_reads(tmp_path):
    from ase.db import connect

    with connect(tmp_path / "m.db") as db:
        for atoms in molecules(energy_in="calc"):
            db.write(atoms)
    data = load_dataset("structures", path=str(tmp_path / "m.db"), target="energy", seed=0)
    assert len(data.train) + len(data.val) == len(NAMES)


def test_periodic_cells_are_honoured(tmp_path):
    # One Cu atom per primitive cell: every neighbour is a periodic image (fcc: 12 at 2.55 A).
    crystals = []
    for a in (3.55, 3.60, 3.65):
        atoms = bulk("Cu", "fcc", a=a)
        atoms.info["y"] = a
        crystals.append(atoms)
    path = write(tmp_path / "cu.extxyz", crystals)
    data = load_dataset("structures", path=path, target="y", cutoff=2.7, seed=0)
    for graph in data.train + data.val:
        assert graph.num_nodes == 1 and graph.num_edges == 12
        np.testing.assert_allclose(graph.edges, graph.target / np.sqrt(2), rtol=1e-6)


def test_index_picks_structures_and_keeps_their_file_numbers(tmp_path):
    path = write(tmp_path / "m.extxyz", molecules())
    data = load_dataset("structures", path=path, target="energy_kcal", index="2:8:2", seed=0)
    assert sorted(g.source_index for g in data.train + data.val) == [2, 4, 6]


def test_the_key_carries_the_files_hash(tmp_path):
    path = write(tmp_path / "m.extxyz", molecules())
    first = load_dataset("structures", path=path, target="energy_kcal", seed=0).key
    assert load_dataset("structures", path=path, target="energy_kcal", seed=0).key == first
    changed = molecules()
    changed[0].positions[0, 0] += 0.1
    write(path, changed)
    assert load_dataset("structures", path=path, target="energy_kcal", seed=0).key != first


def nan_molecules():
    atoms = molecules()
    atoms[5].positions[1, 2] = np.nan
    return atoms


def missing_target():
    atoms = molecules()
    del atoms[2].info["energy_kcal"]
    return atoms


@pytest.mark.parametrize(
    ("make", "params", "message"),
    [
        (missing_target, {}, "m.extxyz: structure 2 (H3N): has no target 'energy_kcal'"),
        (nan_molecules, {}, "m.extxyz: structure 5 (CHN): positions hold NaN or Inf"),
        (molecules, {"index": "1:x"}, "index='1:x' is not valid"),
        (molecules, {"cutoff": -1.0}, "cutoff=-1.0 must be positive"),
    ],
)
def test_bad_structures_are_named_by_file_and_index(tmp_path, make, params, message):
    path = write(tmp_path / "m.extxyz", make())
    with pytest.raises(DataError) as error:
        load_dataset("structures", path=path, target="energy_kcal", seed=0, **params)
    assert message in str(error.value)


def test_an_unreadable_file_is_named(tmp_path):
    path = tmp_path / "m.extxyz"
    path.write_text("this is not\na structure file\n")
    with pytest.raises(DataError, match=r"m.extxyz: cannot read it as any format ASE knows"):
        load_dataset("structures", path=str(path), seed=0)


def test_a_relative_path_is_relative_to_the_case_file(tmp_path, monkeypatch):
    folder = tmp_path / "project"
    folder.mkdir()
    write(folder / "m.extxyz", molecules())
    monkeypatch.chdir(tmp_path)  # not the case file's folder
    case = parse_case(
        '[dataset]\nname = "structures"\npath = "m.extxyz"\ntarget = "energy_kcal"\n',
        base_dir=folder,
    )
    assert case.dataset_params["path"] == str(folder / "m.extxyz")


def test_npz_round_trips_the_graphs_in_jraph_layout(tmp_path):
    path = write(tmp_path / "m.extxyz", molecules())
    data = load_dataset("structures", path=path, target="energy_kcal", seed=0)
    graphs = sorted(data.train + data.val, key=lambda g: g.source_index)
    file = save_graphs(graphs, tmp_path / "g.npz")
    with np.load(file) as arrays:
        assert arrays["n_node"].tolist() == [g.num_nodes for g in graphs]
        # jraph numbers nodes across the whole tuple: the second graph's edges point past
        # the first graph's nodes.
        assert arrays["senders"][graphs[0].num_edges :].min() >= graphs[0].num_nodes
    again = read_graphs(file)
    for old, new in zip(graphs, again, strict=True):
        np.testing.assert_array_equal(old.nodes, new.nodes)
        np.testing.assert_array_equal(old.edges, new.edges)
        np.testing.assert_array_equal(old.senders, new.senders)
        np.testing.assert_array_equal(old.receivers, new.receivers)
        assert old.target == new.target
    loaded = load_dataset("npz", path=str(file), seed=0)
    assert len(loaded.train) + len(loaded.val) == len(graphs)


def test_npz_accepts_jraph_globals_and_names_missing_arrays(tmp_path):
    path = tmp_path / "g.npz"
    np.savez(path, nodes=np.ones((3, 2)), edges=np.ones(2), senders=[0, 1], receivers=[1, 0])
    with pytest.raises(DataError, match=r"g\.npz: lacks the arrays n_node, n_edge, targets"):
        load_dataset("npz", path=str(path), seed=0)
    np.savez(
        path,
        nodes=np.ones((4, 2)),
        edges=np.ones(2),
        senders=[0, 3],
        receivers=[1, 2],
        n_node=[2, 2],
        n_edge=[1, 1],
        globals=[[1.0], [2.0]],
    )
    graphs = read_graphs(path)
    assert [g.target for g in graphs] == [1.0, 2.0]
    assert graphs[1].senders.tolist() == [1]  # 3 - the first graph's 2 nodes


def test_a_planted_nan_is_named_by_the_users_index(tmp_path):
    path = write(tmp_path / "m.extxyz", molecules())
    data = load_dataset("structures", path=path, target="energy_kcal", seed=0)
    graphs = sorted(data.train + data.val, key=lambda g: g.source_index)
    bad = graphs[5]
    graphs[5] = type(bad)(bad.nodes, bad.edges, bad.senders, bad.receivers, float("nan"))
    file = save_graphs(graphs, tmp_path / "g.npz")
    with pytest.raises(DataError, match=r"graph 5: target nan is not finite"):
        load_dataset("npz", path=str(file), seed=3)


def with_isolated_atoms():
    """The molecules, then: two H 9 A apart (no pair within 4 A), three single atoms, and
    water with a helium atom 6 A away (one isolated atom beside bonded ones)."""
    atoms = molecules()
    atoms.append(Atoms("H2", positions=[[0, 0, 0], [0, 0, 9.0]]))
    atoms.extend(Atoms(symbol, positions=[[0, 0, 0]]) for symbol in ("H", "O", "C"))
    water = g2["H2O"].copy()
    water.append("He")
    water.positions[-1] = water.positions[0] + [0.0, 0.0, 6.0]
    atoms.append(water)
    for each in atoms[len(NAMES) :]:
        each.info["energy_kcal"] = -1.5 * len(each)
    return atoms


def neighbours(atoms, cutoff=4.0):
    """``[num_atoms, num_atoms]`` bool: which atoms lie within ``cutoff`` of which."""
    distances = atoms.get_all_distances()
    return (distances < cutoff) & ~np.eye(len(atoms), dtype=bool)


def test_isolated_atoms_and_structures_without_edges_are_kept_and_counted(tmp_path):
    written = with_isolated_atoms()
    path = write(tmp_path / "m.extxyz", written)
    data = load_dataset("structures", path=path, target="energy_kcal", seed=0)
    graphs = data.train + data.val
    assert data.num_train_graphs + data.num_val_graphs == len(written) == len(graphs)
    for graph in graphs:
        atoms = written[graph.source_index]
        assert graph.num_nodes == len(atoms)
        assert graph.num_edges == int(neighbours(atoms).sum())
    near = [neighbours(atoms) for atoms in written]
    assert data.isolated_nodes == sum(int((~n.any(axis=1)).sum()) for n in near) > 0
    assert data.graphs_without_edges == sum(not n.any() for n in near) > 0
    distances = np.concatenate(
        [a.get_all_distances()[n] for a, n in zip(written, near, strict=True)]
    )
    assert data.num_edges == distances.size
    assert data.edge_min == pytest.approx(distances.min())
    assert data.edge_max == pytest.approx(distances.max())
    assert data.edge_max < data.cutoff == 4.0


def test_a_file_without_isolated_atoms_counts_none(tmp_path):
    path = write(tmp_path / "m.extxyz", molecules())
    data = load_dataset("structures", path=path, target="energy_kcal", seed=0, cutoff=2.0)
    assert data.cutoff == 2.0
    assert data.isolated_nodes == sum(
        int((~neighbours(a, 2.0).any(axis=1)).sum()) for a in molecules()
    )
    assert data.graphs_without_edges == 0
    assert data.edge_max < 2.0


def test_a_batch_without_edges_trains_without_a_false_failure(tmp_path):
    """At batch size 1, each single atom is a batch of no edges: its logits are empty,
    which the step guard read as a non-finite forward pass before it counted -inf (the max
    over nothing) as finite."""
    from stability import TrainConfig, Trainer, get_variant

    path = write(tmp_path / "m.extxyz", with_isolated_atoms())
    data = load_dataset("structures", path=path, target="energy_kcal", seed=0)
    assert any(g.num_edges == 0 for g in data.train), "guards the test: an edgeless graph"
    config = TrainConfig(batch_size=1, epochs=2, hidden=8, learning_rate=0.01)
    for variant in ("raw_e", "stable_softmax"):
        result = Trainer(get_variant(variant), data, config).run()
        assert result.first_nan_epoch is None, (variant, result.first_nan_where)
        assert np.isfinite(result.final_mae)
