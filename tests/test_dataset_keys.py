"""Data set keys are derived from the builder's name and arguments (``dataset_key``), and
``dataset_from_key`` reads every registered data set's key back into the same graphs."""

import inspect
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

import stability
from stability.core.errors import DataError
from stability.data import Dataset, dataset_from_key, dataset_key, list_datasets, load_dataset
from stability.data import registry as data_registry
from stability.data.graphs import Graph
from stability.sweep.cases import load_case

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = Path(stability.__file__).parent
BUGS = PACKAGE / "zoo" / "bugs"
ZOO_CASES = sorted(BUGS.glob("*.toml"))

# The built-in data sets, small: name -> parameters (``path`` is filled in by ``files``).
BUILT_IN = {
    "synthetic": {"num_graphs": 12},
    "generated": {"num_graphs": 8, "distribution": "outliers"},
    "g2": {"perturbed_copies": 1},
    "npz": {},
    "structures": {"target": "energy_kcal"},
}


@pytest.fixture(autouse=True)
def registries(isolated_registries):
    """The registries as they were, so the zoo's data sets stay out of ``list_datasets``
    elsewhere; the bug modules this test imported are forgotten too (``isolated_registries``
    keeps the package's modules), so the next test's ``load_case`` registers them again."""
    before = set(sys.modules)
    yield
    for name in set(sys.modules) - before:
        if Path(getattr(sys.modules[name], "__file__", None) or "/").parent == BUGS:
            del sys.modules[name]


@pytest.fixture
def files(tmp_path, monkeypatch):
    """An ``.npz`` and an ``.extxyz`` in the working folder, where a key's file name points."""
    monkeypatch.chdir(tmp_path)
    dataset = load_dataset("synthetic", seed=0, num_graphs=10)
    stability.save_graphs(dataset.train + dataset.val, tmp_path / "g.npz")
    paths = {"npz": str(tmp_path / "g.npz")}
    try:
        import ase.io
        from ase.collections import g2
    except ImportError:
        return paths
    molecules = [g2[name] for name in ("H2O", "CH4", "NH3", "C2H6", "CO2", "HCN")]
    for atoms in molecules:
        atoms.info["energy_kcal"] = -1.5 * len(atoms)
    ase.io.write(tmp_path / "m.extxyz", molecules)
    return {**paths, "structures": str(tmp_path / "m.extxyz")}


def built_in(name, files):
    if name in ("g2", "structures"):
        pytest.importorskip("ase")
    params = {"seed": 1, **BUILT_IN[name]}
    if name in files:
        params["path"] = files[name]
    return name, params


def zoo_case(path):
    case = load_case(path)  # registers the bug's own data set, if it has one
    return case.dataset, {"seed": 0, **case.dataset_params}


CASES = [pytest.param("built_in", name, id=name) for name in BUILT_IN] + [
    pytest.param("zoo", path, id=f"zoo-{path.stem}") for path in ZOO_CASES
]


def setup(kind, which, files):
    return built_in(which, files) if kind == "built_in" else zoo_case(which)


def graph_arrays(dataset):
    """Every graph's arrays and target, train then validation, in order."""
    return [
        (g.nodes, g.edges, g.senders, g.receivers, g.target, g.source_index)
        for g in dataset.train + dataset.val
    ]


def assert_same_graphs(a, b):
    assert a.num_train_graphs == b.num_train_graphs and a.cutoff == b.cutoff
    for i, (old, new) in enumerate(zip(graph_arrays(a), graph_arrays(b), strict=True)):
        for field, x, y in zip(("nodes", "edges", "senders", "receivers"), old, new, strict=False):
            np.testing.assert_array_equal(x, y, err_msg=f"graph {i}: {field} differs")
        assert old[4:] == new[4:], f"graph {i}: target or source index differs"


@pytest.mark.parametrize(("kind", "which"), CASES)
def test_every_key_rebuilds_the_same_key_and_graphs(kind, which, files):
    name, params = setup(kind, which, files)
    dataset = load_dataset(name, **params)
    assert dataset.key == dataset_key(name, params), "the key differs from the one derived"
    assert dataset.key.startswith(f"{name}(") and "val_fraction=" in dataset.key
    rebuilt = dataset_from_key(dataset.key)
    assert rebuilt.key == dataset.key
    assert_same_graphs(dataset, rebuilt)


@pytest.mark.parametrize(("kind", "which"), CASES)
def test_another_val_fraction_is_another_key(kind, which, files):
    name, params = setup(kind, which, files)
    fractions = [0.25, 0.5] if params.get("val_fraction") != 0.25 else [0.3, 0.5]
    keys = {load_dataset(name, **{**params, "val_fraction": f}).key for f in fractions}
    assert len(keys) == 2, keys


def test_every_data_set_of_the_package_is_covered():
    for path in ZOO_CASES:
        load_case(path)
    ours = {
        name
        for name in list_datasets()
        if PACKAGE in Path(inspect.getfile(data_registry._datasets.get(name))).parents
    }
    covered = set(BUILT_IN) | {load_case(path).dataset for path in ZOO_CASES}
    assert ours <= covered, f"no round trip for {sorted(ours - covered)}"


def test_the_seed_cases_key_names_every_argument():
    case = load_case(ROOT / "cases" / "seed.toml")
    key = dataset_key(case.dataset, {"seed": 0, **case.dataset_params})
    assert key == (
        "synthetic(seed=0,num_graphs=2000,min_nodes=6,max_nodes=15,box=5.0,min_distance=0.5,"
        "cutoff=4.0,num_types=4,attend='nearest',val_fraction=0.1)"
    )


def test_an_integer_for_a_float_parameter_is_the_same_data_set():
    as_int = load_dataset("synthetic", seed=0, num_graphs=6, cutoff=4, box=np.int64(5)).key
    assert as_int == load_dataset("synthetic", seed=0, num_graphs=6, cutoff=4.0, box=5.0).key


def test_generated_keys_are_those_of_the_committed_rows():
    """``generated``'s derived key is byte for byte the one its committed rows carry."""
    committed = pd.read_csv(ROOT / "reports" / "generated.csv")["dataset"]
    case = load_case(ROOT / "cases" / "generated.toml")
    drawn_by = committed[0].rsplit("hypothesis=", 1)[1].strip("')")
    params = {**case.dataset_params, "hypothesis": drawn_by}
    keys = {dataset_key("generated", {**params, "seed": s}) for s in range(case.num_datasets)}
    assert set(committed) == keys


def test_a_changed_file_is_refused_not_rebuilt_under_its_old_key(files):
    key = load_dataset("npz", seed=0, path=files["npz"]).key
    assert key.startswith("npz(path='g.npz',seed=0,val_fraction=0.2,sha256='")
    graphs = load_dataset("synthetic", seed=5, num_graphs=10)
    stability.save_graphs(graphs.train + graphs.val, files["npz"])
    with pytest.raises(DataError, match=r"^data set key .* names sha256='[0-9a-f]{12}', the da"):
        dataset_from_key(key)


def test_a_builders_own_key_is_replaced_by_the_derived_one():
    graph = Graph(
        nodes=np.eye(2),
        edges=np.ones((2, 1)),
        senders=np.array([0, 1], np.int32),
        receivers=np.array([1, 0], np.int32),
        target=1.0,
    )

    @stability.register_dataset
    def keyed_by_hand(*, seed: int = 0, scale: float = 1.0) -> Dataset:
        return Dataset(key="my own words", train=[graph], val=[graph])

    dataset = load_dataset("keyed_by_hand", seed=2)
    assert dataset.key == "keyed_by_hand(seed=2,scale=1.0)"
    # Outside the registry, a key given is the key.
    assert Dataset(key="mine", train=[graph], val=[graph]).key == "mine"
    assert Dataset.from_graphs("mine", [graph, graph]).key == "mine"


def test_a_value_a_key_cannot_hold_is_a_one_line_error():
    with pytest.raises(DataError, match=r"^data set synthetic: cutoff=nan cannot be written"):
        load_dataset("synthetic", seed=0, num_graphs=4, cutoff=float("nan"))
