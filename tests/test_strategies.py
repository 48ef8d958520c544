"""The strategies: their arguments, what they draw, and the reproducible draws the runner uses."""

import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from conftest import TINY_CASE
from hypothesis import find, given
from hypothesis.errors import InvalidArgument

from stability.cli import main
from stability.compat.hypothesis_engine import draw
from stability.core.errors import StabilityError
from stability.data import dataset_from_key, load_dataset
from stability.data.graphs import validate_graph
from stability.data.strategies import datasets, edge_distances, graphs
from stability.sweep.cases import parse_case
from stability.sweep.runner import case_datasets, run_case

ROOT = Path(__file__).parent.parent


@pytest.mark.parametrize(
    ("build", "message"),
    [
        pytest.param(lambda: edge_distances(min_size=-1), "min_size", id="negative-size"),
        pytest.param(lambda: edge_distances(min_size=5, max_size=2), "<= max_size", id="sizes"),
        pytest.param(lambda: edge_distances(min_value=-1.0), "min_value", id="negative"),
        pytest.param(lambda: edge_distances(max_value=float("inf")), "max_value", id="inf"),
        pytest.param(lambda: edge_distances(min_value=3.0, max_value=1.0), "<= max", id="bounds"),
        pytest.param(lambda: edge_distances(distribution="gauss"), "uniform", id="distribution"),
        pytest.param(
            lambda: edge_distances(min_value=0.0, distribution="log_uniform"),
            "min_value > 0",
            id="log-from-zero",
        ),
        pytest.param(lambda: edge_distances(max_outlier=1.0), "max_outlier", id="outlier"),
        pytest.param(lambda: graphs(min_nodes=0), "min_nodes", id="no-nodes"),
        pytest.param(lambda: graphs(min_edges=9, max_edges=3), "<= max_edges", id="edges"),
        pytest.param(lambda: graphs(num_types=0), "num_types", id="types"),
        pytest.param(lambda: graphs(attend="middle"), "attend", id="attend"),
        pytest.param(lambda: graphs(max_distance=-2.0), "max_value", id="graph-distance"),
        pytest.param(lambda: datasets(min_graphs=1), "min_graphs", id="one-graph"),
        pytest.param(lambda: datasets(val_fraction=1.0), "val_fraction", id="val"),
    ],
)
def test_bad_arguments_fail_when_the_strategy_is_built(build, message):
    with pytest.raises(InvalidArgument, match=message):
        build()


@pytest.mark.parametrize(
    "distribution", [None, "uniform", "log_uniform", "clustered", "clustered_low", "clustered_high"]
)
def test_distances_stay_in_bounds(distribution):
    # max_outlier = max_value keeps the outliers that "any" (None) may draw in range too.
    strategy = edge_distances(min_size=1, max_size=30, distribution=distribution, max_outlier=4.0)

    @given(strategy)
    def check(distances):
        assert 1 <= distances.size <= 30
        assert ((distances >= 0.5) & (distances <= 4.0)).all(), distances

    check()


@pytest.mark.parametrize(
    ("distribution", "near"), [("clustered_low", 0.5), ("clustered_high", 4.0)]
)
def test_clustered_at_a_bound_stays_within_a_tenth_of_the_range_of_it(distribution, near):
    @given(edge_distances(min_size=1, max_size=30, distribution=distribution))
    def check(distances):
        assert (abs(distances - near) <= 0.1 * (4.0 - 0.5) + 1e-12).all(), distances

    check()


@given(edge_distances(min_size=1, max_size=30, distribution="outliers", max_outlier=40.0))
def test_outliers_are_rare_and_above_the_range(distances):
    outliers = distances > 4.0
    assert outliers.sum() <= max(1, distances.size // 10), distances
    assert ((distances >= 0.5) & (distances <= 40.0)).all(), distances


@given(graphs(max_nodes=8, self_loops=False, duplicate_edges=False))
def test_graphs_are_valid_without_self_loops_or_duplicates(graph):
    validate_graph(graph, 0)
    assert (graph.senders != graph.receivers).all()
    pairs = set(zip(graph.receivers.tolist(), graph.senders.tolist(), strict=True))
    assert len(pairs) == graph.num_edges


@pytest.mark.parametrize(
    ("strategy", "condition"),
    [
        pytest.param(graphs(), lambda g: g.num_edges == 0 and g.num_nodes > 1, id="no-edges"),
        pytest.param(
            graphs(min_edges=1),
            lambda g: g.num_edges and len(set(g.receivers) | set(g.senders)) < g.num_nodes,
            id="isolated-node",
        ),
        pytest.param(
            graphs(duplicate_edges=True),
            lambda g: len(set(zip(g.receivers, g.senders, strict=True))) < g.num_edges,
            id="duplicate-edge",
        ),
        pytest.param(
            graphs(self_loops=True), lambda g: (g.senders == g.receivers).any(), id="self-loop"
        ),
    ],
)
def test_graphs_reach_the_edge_cases(strategy, condition):
    assert condition(find(strategy, condition))


@given(datasets(max_graphs=6))
def test_datasets_split_by_graph(dataset):
    assert dataset.train and dataset.val
    assert 2 <= len(dataset.train) + len(dataset.val) <= 6


def test_a_seeded_draw_is_reproducible_and_seed_dependent():
    strategy = graphs(min_edges=3)
    first, again, other = (draw(strategy, seed=s) for s in (7, 7, 8))
    np.testing.assert_array_equal(first.edges, again.edges)
    assert first.target == again.target
    assert first.edges.shape != other.edges.shape or not np.array_equal(first.edges, other.edges)


def test_a_seeded_draw_does_not_depend_on_what_else_is_imported():
    """Hypothesis mixes in constants found in imported modules; draw() must not."""
    code = (
        "from stability.data.strategies import draw, graphs;"
        "print(draw(graphs(min_edges=3), seed=7).edges.ravel().tolist())"
    )
    done = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env={"PYTHONPATH": str(ROOT), "PATH": ""},
        timeout=120,
        check=True,
    )
    here = draw(graphs(min_edges=3), seed=7).edges.ravel().tolist()
    assert done.stdout.strip() == str(here)


GENERATED = {"num_graphs": 12, "min_nodes": 3, "max_nodes": 6, "distribution": "outliers"}


def test_the_dataset_key_rebuilds_the_same_graphs():
    dataset = load_dataset("generated", seed=4, **GENERATED)
    rebuilt = dataset_from_key(dataset.key)
    assert rebuilt.key == dataset.key
    for a, b in zip(dataset.train + dataset.val, rebuilt.train + rebuilt.val, strict=True):
        np.testing.assert_array_equal(a.edges, b.edges)
        np.testing.assert_array_equal(a.senders, b.senders)
        assert a.target == b.target


@pytest.mark.parametrize("key", ["synthetic(seed=0,nodes=6-15)", "generated(", "nope(seed=1)"])
def test_a_bad_key_is_a_one_line_error(key):
    with pytest.raises(StabilityError, match=r"cannot be rebuilt|unknown data set"):
        dataset_from_key(key)


GENERATED_CASE = (
    TINY_CASE.replace("epochs = 2", "epochs = 1\nnum_datasets = 2")
    .replace('name = "synthetic"', 'name = "generated"\ndistribution = "outliers"')
    .replace("num_graphs = 48", "num_graphs = 16")
)


def test_every_variant_trains_on_the_same_generated_datasets():
    case = parse_case(GENERATED_CASE, source="generated")
    keys = [d.key for d in case_datasets(case)]
    assert keys == [d.key for d in case_datasets(case)], "the same case drew other data sets"
    assert len(set(keys)) == 2
    results = run_case(case, progress=False)
    assert {(r.variant, r.dataset) for r in results} == {
        (v, k) for v in case.variants for k in keys
    }
    again = case_datasets(replace(case, variants=("raw_e",)))
    assert [d.key for d in again] == keys


def test_a_bad_distribution_in_a_case_is_a_one_line_error(tmp_path, capsys):
    path = tmp_path / "bad.toml"
    path.write_text(GENERATED_CASE.replace('"outliers"', '"gauss"'))
    code = main(["run", str(path), "--out", str(tmp_path), "--no-progress"])
    stderr = capsys.readouterr().err
    assert code == 2, stderr
    lines = stderr.strip().splitlines()
    assert len(lines) == 1 and "distribution='gauss'" in lines[0], stderr


def test_the_key_names_the_hypothesis_version_and_another_one_is_refused():
    from hypothesis import __version__

    dataset = load_dataset("generated", seed=4, **GENERATED)
    assert f"hypothesis={__version__!r}" in dataset.key
    older = dataset.key.replace(f"hypothesis={__version__!r}", "hypothesis='6.0.0'")
    with pytest.raises(StabilityError, match=r"drawn with hypothesis 6\.0\.0.*whose draw may"):
        dataset_from_key(older)


def test_resume_refuses_runs_drawn_by_another_hypothesis_version(tmp_path, capsys):
    """A store whose rows came from another Hypothesis' draw: --resume would mix two draws."""
    from hypothesis import __version__

    path = tmp_path / "generated.toml"
    path.write_text(GENERATED_CASE.replace("num_datasets = 2", "num_datasets = 1"))
    out = tmp_path / "out"
    assert main(["run", str(path), "--out", str(out), "--no-progress"]) == 0
    csv = out / "tiny.csv"
    csv.write_text(csv.read_text().replace(f"hypothesis='{__version__}'", "hypothesis='6.0.0'"))
    for stale in out.glob("tiny.runs.sqlite*"):
        stale.unlink()  # the CSV is taken back into a new store on --resume
    code = main(["run", str(path), "--out", str(out), "--resume", "--no-progress"])
    err = capsys.readouterr().err
    assert code == 2 and "hypothesis='6.0.0'" in err and "--resume cannot mix" in err, err
    assert "hypothesis='6.0.0'" in csv.read_text(), "the refused resume rewrote the CSV"
