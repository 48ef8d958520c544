"""The hunt (stability.explore.hunt): its space, its direction, its moves, the case it writes
and the report it writes, and its command line."""

import math
from dataclasses import replace

import numpy as np
import pytest
import tensorflow as tf

from stability.core.results import EpochRecord, RunResult
from stability.data.graphs import batch_graphs
from stability.data.strategies import attention_target
from stability.explore import headroom
from stability.explore.found_case import write_found_case
from stability.explore.headroom import Margin, direction, record_margins, run_margin
from stability.explore.hunt import Hunt, Plan, Push, Training, hunt, hunt_config
from stability.explore.hunt_report import HUNT_FIELDS, hunt_frame, hunt_markdown
from stability.explore.hunt_space import HuntSpace, graph_statistics
from stability.model.variants import get_variant
from stability.sweep.cases import load_case, parse_case
from stability.sweep.runner import run_case
from stability.train.config import TrainConfig
from stability.train.forward import forward
from stability.train.trainer import Trainer

#: Distances up to 64 on 32 generated graphs, 2 epochs: the top of the range breaks
#: stable_softmax's first step (cases/hunt.toml, smaller).
SPACE_CASE = """
name = "space"
variants = ["stable_softmax"]
seeds = [0]
batch_sizes = [16]
learning_rates = [0.01]
epochs = 2
# The hunt pushes distances toward float32's exp limit (88.7); under the matrix's float64
# cells the same space holds no failure, so the case names its dtype.
dtype = "float32"

[model]
hidden = 16

[dataset]
name = "generated"
num_graphs = 32
min_distance = 0.5
max_distance = 64.0
max_outlier = 64.0
"""


@pytest.fixture(scope="module")
def space_case():
    return parse_case(SPACE_CASE)


def test_plain_draws_stay_in_the_space(space_case):
    space = HuntSpace.of_case(space_case)
    for index in range(3):
        graphs = space.plain(0, index)
        assert len(graphs) == space.num_graphs
        for g in graphs:
            assert space.min_nodes <= g.num_nodes <= space.max_nodes
            assert g.num_edges <= space.max_edges
            assert not (g.senders == g.receivers).any(), "no self-loops"
            d = g.edges.reshape(-1)
            assert ((d >= space.min_distance) & (d <= space.max_distance)).all()
    assert space.plain(0, 1)[0].edges.tolist() == space.plain(0, 1)[0].edges.tolist()
    assert space.plain(0, 1)[0].edges.tolist() != space.plain(1, 1)[0].edges.tolist()


def test_synthetic_space_stays_below_the_cutoff():
    case = load_case("cases/seed.toml")
    space = HuntSpace.of_case(case, num_graphs=20)
    assert space.min_distance == 0.5 and space.max_distance < 4.0
    assert len(space.start()) == 20


def test_moves_keep_bounds_and_the_target_rule(space_case):
    space = HuntSpace.of_case(space_case)
    graphs = space.plain(0, 0)
    edges = sum(g.num_edges for g in graphs)
    rng = np.random.default_rng(0)
    up = Push(1.0, 3, np.ones(edges), rng.normal(size=edges))
    down = Push(2.0, 3, -np.ones(edges), rng.normal(size=edges))
    plan = Plan(graphs, space, [("exp underflow", up), ("loss exp", down)])
    moves = plan.moves(10.0)  # a step past both bounds: clipped
    labels = [label for _, label in moves]
    assert labels[0].startswith("exp underflow") and "drop" in labels[0]
    assert any("connect" in label for label in labels)
    for moved, label in moves:
        for g in moved:
            d = g.edges.reshape(-1)
            assert ((d >= space.min_distance) & (d <= space.max_distance)).all(), label
            types = g.nodes.argmax(axis=1)
            rule = attention_target(types, g.senders, g.receivers, d, space.num_types, "nearest")
            assert g.target == rule, label
    stepped_up = dict((label, m) for m, label in moves)["exp underflow: log-distance step 10"]
    assert all((g.edges == space.max_distance).all() for g in stepped_up)
    connected = next(m for m, label in moves if "connect" in label)
    assert graph_statistics(connected, space)["isolated_nodes"] == 0
    assert graph_statistics(graphs, space)["isolated_nodes"] > 0


def test_direction_is_the_gradient_of_the_level(tiny_dataset):
    """The level's direction against a finite difference of the same soft maximum."""
    config = TrainConfig(hidden=8, dtype="float64")
    recipe = Trainer(get_variant("raw_e"), tiny_dataset, config).build()
    graphs = tiny_dataset.train[:4]
    scale = (tiny_dataset.target_mean, tiny_dataset.target_std)
    grad = direction(recipe, graphs, "exp underflow", "float64", scale, lookahead=False)

    def level(log_shift: float, edge: int) -> float:
        flat = np.concatenate([g.edges.reshape(-1) for g in graphs])
        flat[edge] *= math.exp(log_shift)
        pieces = np.split(flat, np.cumsum([g.num_edges for g in graphs])[:-1])
        moved = [replace(g, edges=p.reshape(-1, 1)) for g, p in zip(graphs, pieces, strict=True)]
        inputs = {
            k: tf.constant(v) for k, v in batch_graphs(moved, dtype="float64").as_inputs().items()
        }
        out = forward(recipe.model, inputs, training=False)
        return float(headroom._sites(out, inputs, "exp underflow"))

    edge = int(np.argmax(np.abs(grad)))
    assert grad[edge] != 0.0
    h = 1e-6
    numeric = (level(h, edge) - level(-h, edge)) / (2 * h)
    assert numeric == pytest.approx(grad[edge], rel=1e-4, abs=1e-8)


def test_margins_read_the_history():
    record = EpochRecord(3, min_node_max_logit=-40.0, max_exp_arg=10.0, max_abs_grad=1e9)
    margins = record_margins(record, "float32")
    assert margins["exp underflow"] == pytest.approx(math.log(87.336544 / 40.0), rel=1e-5)
    assert margins["exp overflow"] == pytest.approx(math.log(88.72284 / 10.0), rel=1e-5)
    assert margins["gradient square"] == pytest.approx(math.log(1.8446743e19 / 1e9), rel=1e-5)
    assert margins["logit"] == math.inf  # NaN: no logits
    result = RunResult("c", "raw_e", 0, "d", 32, 0.01, 5, "float32", history=[record])
    assert run_margin(result) == Margin("exp underflow", margins["exp underflow"], 3)
    failed = replace(result, first_nan_epoch=4, failure_cause="forward overflow")
    assert run_margin(failed) == Margin("exp overflow", 0.0, 4)


def _fake_hunt(case, failed_at: int | None) -> Hunt:
    space = HuntSpace.of_case(case)
    state = Hunt(case, "stable_softmax", "directed", space, hunt_config(case))
    graphs = space.plain(0, 0)
    for index in (1, 2):
        result = RunResult(case.name, "stable_softmax", 0, "d", 16, 0.01, 2, "float32")
        margin = Margin("loss exp", 1.5 / index, 0)
        if index == failed_at:
            result = replace(
                result,
                first_nan_epoch=2,
                first_nan_step=7,
                failure_cause="loss",
                first_nan_where="loss",
                first_nan_op="Exp (Exp)",
            )
            margin = run_margin(result)
        training = Training(
            index, f"move {index}", result, margin, graph_statistics(graphs, space), 1.25 * index
        )
        state.trainings.append(training)
        state.best, state.best_graphs = training, graphs
    return state


def test_report_prose_follows_the_trainings(space_case, tmp_path):
    found = _fake_hunt(space_case, failed_at=2)
    text = hunt_markdown(found, tmp_path / "x.toml", None)
    assert "The first failure came at training 2 (3.8 s)" in text
    assert "fails at epoch 2, step 7" in text and "cause `loss`" in text
    assert "The case's own data stayed finite (loss exp: margin 1.5 e-folds before" not in text
    assert "not rerun here" in text
    frame = hunt_frame(found)
    assert list(frame.columns) == list(HUNT_FIELDS) and frame["failed"].tolist() == [False, True]
    missed = _fake_hunt(space_case, failed_at=None)
    text = hunt_markdown(missed, None, None)
    assert "No training failed in 2 trainings" in text and "closest was training 2" in text


def test_found_case_reproduces_in_run(space_case, tmp_path):
    """The hunt's own claim: the case it writes fails under `run` as its training did."""
    found = hunt(space_case, "stable_softmax", budget=4)
    assert found.found, [t.move for t in found.trainings]
    assert found.trainings[0].move == "the case's data"
    path = write_found_case(found, tmp_path)
    (rerun,) = run_case(load_case(path), progress=False)
    best = found.best.result
    assert (rerun.first_nan_epoch, rerun.first_nan_step, rerun.failure_cause) == (
        best.first_nan_epoch,
        best.first_nan_step,
        best.failure_cause,
    )
    assert rerun.final_mae == best.final_mae and rerun.best_mae == best.best_mae


def test_plain_counts_each_draw_as_a_training(space_case):
    found = hunt(space_case, "stable_softmax", budget=2, strategy="plain", seed=0)
    assert [t.move for t in found.trainings][:1] == ["plain draw 0"]
    first = found.trainings_to_failure()
    assert len(found.trainings) == (2 if first is None else first)


def test_bad_input_is_one_line(tmp_path, capsys):
    """In process: each refusal comes before any training, in one line, exit code 2."""
    from stability.cli import main

    case = tmp_path / "space.toml"
    case.write_text(SPACE_CASE)
    npz_case = tmp_path / "file.toml"
    npz_case.write_text(SPACE_CASE.split("[dataset]")[0] + '[dataset]\nname = "npz"\npath = "x"\n')
    for path, variant, message in [
        (case, "nope", "variant"),
        (npz_case, "raw_e", "hunt searches the data of the synthetic or generated data sets"),
    ]:
        assert main(["hunt", str(path), "--variant", variant, "--out", str(tmp_path)]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith("stability: error:") and message in err[0]
    assert not list(tmp_path.glob("*.npz"))


def test_docs_list_the_hunt_columns():
    from pathlib import Path

    text = (Path(__file__).parent.parent / "docs" / "hunt.md").read_text(encoding="utf-8")
    line = " ".join(text.split("Its columns:")[1].split(".\n")[0].split())
    assert [c.strip(" `") for c in line.split(",")] == list(HUNT_FIELDS)


def test_limits_are_climbed_in_the_order_their_moves_predict():
    from stability.explore.hunt import _ranked

    signs, logits = np.ones(3), np.zeros(3)
    near = Push(0.5, 10, signs, logits, predicted=0.45)  # near, but the move barely helps
    far = Push(1.5, 0, signs, logits, predicted=0.0)  # far, but the move crosses the line
    unknown = Push(0.7, 4, signs, logits)  # no prediction: its own margin
    never = Push(math.inf, None, signs, logits)
    ranked = _ranked(
        {"exp underflow": near, "loss exp": far, "gradient square": unknown, "logit": never},
        "exp underflow",
    )
    assert [name for name, _ in ranked] == ["loss exp", "exp underflow", "gradient square"]
