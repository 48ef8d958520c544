"""The doctor (issue 28): its verdict rule and its finding on planted rows, the remedy table,
the report's sentences computed from the rows, the model and data remedies on real built
models and data, and ``python -m stability doctor`` end to end on examples/my_gat.py."""

import csv
import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import keras
import numpy as np
import pytest
import tensorflow as tf
from conftest import TINY_CASE, run_cli

from stability import Recipe, TrainConfig, Trainer
from stability.commands.push import hunt_push
from stability.core.errors import CaseError, RemedyError, StabilityError
from stability.core.failures import Cause
from stability.core.limits import exp_limits
from stability.data import Dataset, load_dataset, register_dataset
from stability.data.edge_transform import transform_edges
from stability.data.graphs import Graph
from stability.data.self_loops import with_self_loops
from stability.doctor.remedies import case_for
from stability.doctor.report import DOCTOR_FIELDS, doctor_markdown, doctor_rows
from stability.doctor.run import (
    LOCALITY,
    ORIGINAL,
    DoctorRun,
    Pushed,
    Trial,
    confirmations,
    diagnosed_case,
    failure_epoch,
    find,
    fresh_seeds,
    has_headroom_warning,
    median_epoch,
    plan,
    push_fixes,
    remedy_budget,
    verdict,
)
from stability.model.remedy import (
    DIVERGENCE,
    HEADROOM,
    SYMPTOMS,
    WEIGHT_GROWTH,
    get_remedy,
    list_remedies,
)
from stability.model.variants import get_variant, register_variant
from stability.report.verdicts import (
    DELAYS,
    DOES_NOT_HELP,
    FIXES,
    HOLDS_ON_THESE_SEEDS,
    HOLDS_ON_THIS_DATA,
    NOT_APPLICABLE,
)
from stability.sweep.cases import Case, load_case, parse_case
from stability.sweep.runner import case_datasets, execute_runs, run_case, run_configs

ROOT = Path(__file__).resolve().parent.parent
OVERFLOW, UNDERFLOW = Cause.FORWARD_OVERFLOW.value, Cause.FORWARD_UNDERFLOW.value
EXPLOSION = Cause.GRADIENT_EXPLOSION.value


def failed(epoch, cause=OVERFLOW, seed=0, layer="message_passing_0"):
    """A planted result row of a run whose first NaN came in ``epoch``."""
    return {
        "seed": str(seed),
        "variant": "raw_e",
        "dtype": "float32",
        "first_nan_epoch": str(epoch),
        "first_nan_step": "1",
        "first_nan_where": "forward",
        "first_nan_layer": layer,
        "first_nan_op": "Exp (softmax_exp)",
        "failure_cause": cause,
        "diverged_epoch": "",
        "final_mae": "",
        "best_mae": "",
        "max_exp_arg": "",
        "min_node_max_logit": "",
        "warning": "",
    }


def finite(mae=1.0, seed=0, max_exp_arg=10.0, dtype="float32"):
    """A planted result row of a run that stayed finite."""
    return {
        **failed(0, seed=seed),
        "dtype": dtype,
        "first_nan_epoch": "",
        "first_nan_step": "",
        "first_nan_where": "",
        "first_nan_layer": "",
        "first_nan_op": "",
        "failure_cause": Cause.NONE.value,
        "final_mae": str(mae),
        "best_mae": str(mae),
        "max_exp_arg": str(max_exp_arg),
        "min_node_max_logit": "-1.0",
    }


# --- the verdict rule ---------------------------------------------------------------------


def test_no_failure_within_the_budget_fixes_and_one_failing_seed_does_not():
    assert verdict([1, 2], [None, None]) == FIXES
    assert verdict([1, 2], [None, 9]) != FIXES
    assert verdict([1, 2], [9, None]) != FIXES


def test_delays_starts_at_exactly_one_and_a_half_times_the_original_median():
    original = [4, 4, 4]  # median 4: delays from a median of 6 on
    assert median_epoch(original) == 4
    assert verdict(original, [6, 6, 6]) == DELAYS
    assert verdict(original, [5, 6, 6]) == DELAYS  # median 6
    assert verdict(original, [5, 5, 6]) == DOES_NOT_HELP  # median 5, just below
    assert verdict([2, 3], [3, 4]) == DOES_NOT_HELP  # 3.5 < 1.5 * 2.5
    assert verdict([2, 3], [3, 5]) == DELAYS  # 4 >= 3.75
    assert verdict([1, 1], [1, 1]) == DOES_NOT_HELP


def test_a_run_without_failure_counts_as_beyond_the_budget_in_the_median():
    assert median_epoch([None, None, 1]) == float("inf")
    assert median_epoch([None, 3, 1]) == 3
    # Two of three remedied runs last the budget: the median is beyond any factor.
    assert verdict([2, 2, 2], [None, None, 1]) == DELAYS
    assert verdict([2, 2, 2], [None, 1, 1]) == DOES_NOT_HELP
    # An original whose median run did not fail cannot be delayed.
    assert verdict([None, None, 1], [None, 50, 50]) == DOES_NOT_HELP


def test_a_kept_headroom_warning_is_no_fix():
    assert verdict([1], [None], warned=[False]) == FIXES
    assert verdict([1], [None], warned=[True]) != FIXES
    assert verdict([1, 1], [None, None], warned=[False, True]) != FIXES


def test_a_verdict_needs_a_remedied_run():
    with pytest.raises(ValueError, match="at least one run"):
        verdict([1], [])


# --- the finding --------------------------------------------------------------------------


def test_the_symptom_is_the_cause_of_the_earliest_failure():
    rows = [failed(3, EXPLOSION, seed=0), failed(1, OVERFLOW, seed=1), finite(seed=2)]
    finding = find(rows)
    assert finding.symptom == OVERFLOW
    assert finding.first is rows[1]
    assert finding.epochs == (3, 1, None)
    rows = [failed(1, EXPLOSION, seed=0), failed(3, OVERFLOW, seed=1)]
    assert find(rows).symptom == EXPLOSION


def test_a_tie_goes_to_the_first_run():
    assert find([failed(2, UNDERFLOW), failed(2, EXPLOSION, seed=1)]).symptom == UNDERFLOW
    assert find([failed(2, EXPLOSION), failed(2, UNDERFLOW, seed=1)]).symptom == EXPLOSION


def test_a_run_that_only_diverged_is_divergence():
    row = {**finite(), "diverged_epoch": "4", "warning": "validation MAE diverged"}
    finding = find([row, finite(seed=1)])
    assert finding.symptom == DIVERGENCE
    assert finding.epochs == (4, None)
    assert finding.first is row


def test_a_finite_run_near_exp_s_overflow_line_is_headroom():
    line = exp_limits("float32").overflow  # 88.72
    assert 0.9 * line < 85 < line
    assert has_headroom_warning(finite(max_exp_arg=85))
    assert not has_headroom_warning(finite(max_exp_arg=10))
    assert not has_headroom_warning(finite(max_exp_arg=85, dtype="float64"))
    warned = finite(max_exp_arg=85, seed=1)
    finding = find([finite(max_exp_arg=10), warned])
    assert finding.symptom == HEADROOM and finding.first is warned
    assert find([finite(max_exp_arg=10)]).symptom is None
    assert find([finite(max_exp_arg=85, dtype="float64")]).symptom is None


def test_the_failure_epoch_is_the_earlier_of_nan_and_divergence():
    assert failure_epoch({"first_nan_epoch": "5", "diverged_epoch": "3"}) == 3
    assert failure_epoch({"first_nan_epoch": "2", "diverged_epoch": "7"}) == 2
    assert failure_epoch({"first_nan_epoch": "", "diverged_epoch": "7"}) == 7
    assert failure_epoch({"first_nan_epoch": "6", "diverged_epoch": "nan"}) == 6
    assert failure_epoch({"first_nan_epoch": "", "diverged_epoch": ""}) is None
    assert failure_epoch({}) is None


def test_the_budget_is_three_times_the_latest_failure_or_the_case_s():
    finding = find([failed(2), failed(5, seed=1), finite(seed=2)])
    assert remedy_budget(finding, 10) == 15
    assert remedy_budget(finding, 20) == 20
    assert remedy_budget(find([failed(1)]), 2) == 3
    assert remedy_budget(find([finite()]), 7) == 7


# --- the table ----------------------------------------------------------------------------


@pytest.mark.parametrize("symptom", SYMPTOMS)
def test_every_remedy_has_a_reason_for_every_symptom(symptom):
    for remedy in list_remedies():
        reason = remedy.reason(symptom)
        assert reason.strip(), (remedy.name, symptom)
        assert reason == (remedy.helps[symptom] if remedy.expected(symptom) else remedy.cannot)


@pytest.mark.parametrize("symptom", [OVERFLOW, UNDERFLOW])
def test_the_seed_s_story_in_the_table(symptom):
    # Issue 28's seed: clipping, a lower rate, a larger batch or epsilon cannot remove a
    # forward overflow; the stable softmax and the constrained kernel do.
    for name in ("clip", "lower_lr", "larger_batch", "adam_epsilon"):
        assert not get_remedy(name).expected(symptom), name
    for name in ("stable_softmax", "kernel_constraint"):
        assert get_remedy(name).expected(symptom), name
    assert get_remedy("clip").expected(EXPLOSION)


#: The planted case: three seeds failing (at epochs 1, 2, 2) in message_passing_0.
PLANTED = Case(
    name="planted",
    variants=("raw_e",),
    seeds=(0, 1, 2),
    batch_sizes=(16,),
    learning_rates=(0.01,),
    epochs=4,
)


def planted_run(outcomes):
    """A ``DoctorRun`` of planted rows: ``outcomes`` maps a remedy to its runs' rows, or to
    the reason it cannot apply."""
    original_case = diagnosed_case(PLANTED, "raw_e", None)
    rows = [failed(1, seed=0), failed(2, seed=1), failed(2, seed=2)]
    original = Trial(ORIGINAL, original_case, rows=rows)
    finding = find(original.rows)
    run = DoctorRun(PLANTED, "raw_e", original, finding, remedy_budget(finding, PLANTED.epochs))
    base = replace(original_case, epochs=run.budget)
    for name, outcome in outcomes.items():
        remedy = get_remedy(name)
        if isinstance(outcome, str):
            run.trials.append(Trial(remedy, None, reason=outcome))
        else:
            case = case_for(remedy, base, "raw_e", finding.layer, f"planted__{name}")
            run.trials.append(Trial(remedy, case, rows=outcome))
    return run


def fine(*maes):
    return [finite(mae, seed=seed) for seed, mae in enumerate(maes)]


def failing(*epochs):
    return [failed(epoch, seed=seed) for seed, epoch in enumerate(epochs)]


def report(run):
    """The doctor's CSV rows by remedy, and the lines of its markdown."""
    rows = doctor_rows(run, "planted.toml")
    return {r["remedy"]: r for r in rows}, doctor_markdown(run, rows, "planted.toml").splitlines()


def line(lines, start):
    """The markdown line that starts with ``start``, or ''."""
    found = [text for text in lines if text.startswith(start)]
    assert len(found) <= 1, found
    return found[0] if found else ""


NO_SOFTMAX = "no layer of the model uses a registered softmax"


def test_the_report_recommends_the_most_local_fix_and_names_the_surprises():
    run = planted_run(
        {
            "clip": fine(3.0, 3.0, 3.0),  # the table says it cannot help: it fixed
            "lower_lr": failing(1, 2, 2),
            "float64": fine(2.0, 2.0, 2.0),
            "squashed_e": fine(1.0, 1.1, 9.0),  # median 1.1, mean 3.7
            "kernel_constraint": failing(1, 1, 2),  # expected to help: it did not
            "stable_softmax": NO_SOFTMAX,
        }
    )
    assert run.finding.symptom == OVERFLOW and run.budget == 6
    rows, lines = report(run)
    assert set(rows["clip"]) == set(DOCTOR_FIELDS)
    assert rows["clip"]["verdict"] == FIXES and rows["clip"]["expected"] == "cannot help"
    assert rows["clip"]["avoided"] == "3" and rows["clip"]["runs"] == "3"
    assert rows["squashed_e"]["final_mae"] == "1.1"
    assert rows["kernel_constraint"]["failure_epochs"] == "1;1;2"
    assert rows["stable_softmax"]["verdict"] == NOT_APPLICABLE
    assert rows["stable_softmax"]["runs"] == "0"

    # The original runs never validated, so every fix keeps the accuracy: the most local
    # change wins, an optimizer setting before the data and the dtype, whatever its MAE.
    recommended = line(lines, "Recommended:")
    assert "**`clip`**" in recommended and "a fix of class optimizer setting" in recommended
    assert recommended.endswith(
        "The other fixes, in that order: `squashed_e` (data cleaning), `float64` (dtype)."
    )
    against = line(lines, "Against the table,")
    assert "`clip`" in against and "float64" not in against and "squashed_e" not in against
    assert line(lines, "Expected to help, but not a fix here:").endswith(
        "`kernel_constraint` (does not help)."
    )
    assert "`lower_lr` (does not help)" in line(lines, "As the table says,")
    assert "`clip`" not in line(lines, "As the table says,")
    table = [text for text in lines if text.startswith("| `stable_softmax`")]
    assert table and f"not applicable: {NO_SOFTMAX}" in table[0]
    assert "Symptom: **forward overflow**" in "\n".join(lines)


def test_a_fix_that_loses_the_accuracy_the_original_reached_comes_after_one_that_keeps_it():
    run = planted_run({"clip": fine(3.0, 3.0, 3.0), "squashed_e": fine(1.0, 1.1, 9.0)})
    run.original.rows = [{**row, "best_mae": "2.0"} for row in run.original.rows]
    # clip is more local, but ends above the original's best MAE (2.0); squashed_e keeps it.
    assert [t.remedy.name for t in run.fixes()] == ["squashed_e", "clip"]
    _, lines = report(run)
    assert "of the 1 fixes that end at or below the original's best MAE" in line(
        lines, "Recommended:"
    )
    run.original.rows = [{**row, "best_mae": "0.5"} for row in run.original.rows]
    assert [t.remedy.name for t in run.fixes()] == ["clip", "squashed_e"]  # neither keeps it


def test_the_report_s_sentences_move_with_the_rows():
    run = planted_run(
        {
            "clip": failing(1, 2, 2),
            "lower_lr": failing(3, 3, 4),  # median 3 >= 1.5 * 2: delays
            "float64": fine(1.0, 1.0, 1.2),
            "squashed_e": fine(1.0, 1.1, 9.0),
            "kernel_constraint": fine(5.0, 5.0, 5.0),
            "stable_softmax": "the model has no attention layer",
        }
    )
    rows, lines = report(run)
    assert rows["lower_lr"]["verdict"] == DELAYS and rows["clip"]["verdict"] == DOES_NOT_HELP
    assert "**`kernel_constraint`**" in line(lines, "Recommended:")  # the most local fix
    assert line(lines, "Against the table,") == ""
    assert line(lines, "Expected to help, but not a fix here:") == ""
    held = line(lines, "As the table says,")
    assert "`clip` (does not help)" in held and "`lower_lr` (delays)" in held
    table = [text for text in lines if text.startswith("| `stable_softmax`")]
    assert "not applicable: the model has no attention layer" in table[0]
    assert NO_SOFTMAX not in "\n".join(lines)


def test_without_a_fix_the_report_says_so_and_names_what_delayed_it():
    run = planted_run(
        {
            "clip": failing(1, 2, 2),
            "lower_lr": failing(3, 3, 4),
            "float64": [finite(2.0), failed(5, seed=1), failed(5, seed=2)],
        }
    )
    rows, lines = report(run)
    assert run.recommended() is None
    assert rows["float64"]["verdict"] == DELAYS and rows["float64"]["avoided"] == "1"
    assert line(lines, "Recommended:") == ""
    assert line(lines, "No remedy fixed the forward overflow within 6 epochs;") == (
        "No remedy fixed the forward overflow within 6 epochs; `lower_lr`, `float64` delayed it."
    )
    assert "`float64` (delays)" in line(lines, "Expected to help, but not a fix here:")


# --- model remedies on built recipes ------------------------------------------------------


@pytest.fixture(scope="module")
def small_dataset():
    return load_dataset("synthetic", seed=0, num_graphs=32, min_nodes=3, max_nodes=6)


CONFIG = TrainConfig(
    seed=0, batch_size=16, learning_rate=1e-2, epochs=1, hidden=8, num_layers=2, dtype="float32"
)


def built(name, dataset):
    return Trainer(get_variant(name), dataset, CONFIG).build()


def test_clip_sets_clipnorm_and_the_seed_s_gradient_transform(small_dataset):
    plain = built("raw_e", small_dataset)
    assert plain.optimizer.clipnorm is None and plain.gradient_transform is None
    recipe = built("raw_e+clip", small_dataset)
    assert recipe.optimizer.clipnorm == 1.0
    assert recipe.optimizer.learning_rate.numpy() == pytest.approx(CONFIG.learning_rate)
    (clipped,) = recipe.gradient_transform([tf.constant([30.0, 40.0])])
    np.testing.assert_allclose(clipped.numpy(), [0.6, 0.8], rtol=1e-6)  # global norm 1


def test_adam_epsilon_raises_epsilon_to_1e_4(small_dataset):
    assert built("raw_e", small_dataset).optimizer.epsilon == pytest.approx(1e-7)
    assert built("raw_e+adam_epsilon", small_dataset).optimizer.epsilon == pytest.approx(1e-4)


def test_stable_softmax_switches_every_attention_layer(small_dataset):
    assert [p.softmax for p in built("raw_e", small_dataset).model.passes] == ["naive"] * 2
    model = built("raw_e+stable_softmax", small_dataset).model
    assert [p.softmax for p in model.passes] == ["stable"] * 2


def test_kernel_constraint_acts_on_the_dense_kernels_of_its_layer_only(small_dataset):
    recipe = built("raw_e+kernel_constraint@message_passing_0", small_dataset)
    model = recipe.model
    inside = [model.passes[0].net, model.passes[0].message]
    outside = [model.embed, model.passes[1].net, model.passes[1].message, model.head]
    for layer in inside:
        assert isinstance(layer.kernel.constraint, keras.constraints.MinMaxNorm), layer.kernel.path
        assert isinstance(layer.kernel.regularizer, keras.regularizers.L2), layer.kernel.path
    for layer in outside:
        assert layer.kernel.constraint is None and layer.kernel.regularizer is None, layer.name
    assert len(model.losses) == len(inside)  # the l2 terms reach the loss
    # The optimizer applies the constraint after an update: kernels of norm 30 come back
    # to norm 1 inside the layer and stay 30 outside it.
    for weight in model.trainable_variables:
        weight.assign(tf.fill(weight.shape, 10.0))
    recipe.optimizer.apply_gradients([(tf.zeros_like(w), w) for w in model.trainable_variables])
    for layer in inside:
        assert np.linalg.norm(layer.kernel.numpy(), axis=0).max() <= 1.0 + 1e-6
    for layer in outside:
        assert np.linalg.norm(layer.kernel.numpy(), axis=0).min() > 1.0


def test_kernel_constraint_in_a_layer_the_model_lacks_cannot_apply(small_dataset):
    with pytest.raises(RemedyError, match="no layer 'nowhere'"):
        built("raw_e+kernel_constraint@nowhere", small_dataset)


class UsersAttention(keras.Model):
    """A user's model: one naive exp/sum attention, no registered softmax."""

    def __init__(self, hidden, **kwargs):
        super().__init__(**kwargs)
        self.embed = keras.layers.Dense(hidden, activation="relu")
        self.score = keras.layers.Dense(1)
        self.head = keras.layers.Dense(2)

    def call(self, inputs):
        h = self.embed(inputs["nodes"])
        senders, receivers = inputs["senders"], inputs["receivers"]
        num_nodes = tf.shape(h)[0]
        edges = tf.cast(inputs["edges"], h.dtype)
        weight = tf.exp(tf.squeeze(self.score(tf.concat([tf.gather(h, senders), edges], -1)), -1))
        total = tf.math.unsorted_segment_sum(weight, receivers, num_nodes)
        alpha = weight / tf.gather(total, receivers)
        h = h + tf.math.unsorted_segment_sum(
            alpha[:, None] * tf.gather(h, senders), receivers, num_nodes
        )
        pooled = tf.math.unsorted_segment_mean(h, inputs["node_graph"], inputs["num_graphs"])
        return self.head(pooled)


@pytest.mark.parametrize(
    ("remedy", "message"), [("stable_softmax", "use_softmax"), ("tanh_cap", "use_logit_transform")]
)
def test_a_user_model_without_the_layer_hook_cannot_take_the_softmax_remedies(
    isolated_registries, small_dataset, remedy, message
):
    @register_variant
    def users_attention(ctx):
        """a user's plain Keras attention"""
        return Recipe(UsersAttention(ctx.hidden), keras.optimizers.Adam(ctx.learning_rate))

    with pytest.raises(RemedyError) as caught:
        built(f"users_attention+{remedy}", small_dataset)
    assert message in str(caught.value) and "\n" not in str(caught.value)
    # The model-agnostic remedies apply to it.
    recipe = built("users_attention+kernel_constraint", small_dataset)
    dense = [recipe.model.embed, recipe.model.score, recipe.model.head]
    assert all(isinstance(d.kernel.constraint, keras.constraints.MinMaxNorm) for d in dense)
    assert built("users_attention+clip", small_dataset).optimizer.clipnorm == 1.0


@pytest.mark.parametrize(
    ("name", "message"),
    [
        ("raw_e+nope", "unknown model remedy 'nope'"),
        ("raw_e+lower_lr", "unknown model remedy 'lower_lr'"),  # a case remedy
        ("raw_e+clip+clip", "names one remedy twice"),
        ("raw_e+clip+", "VARIANT+REMEDY"),
        ("raw_e+clip@x", "takes no @layer"),
        ("+clip", "VARIANT+REMEDY"),
        ("raw_ee+clip", "Did you mean 'raw_e'?"),
    ],
)
def test_a_bad_remedied_name_is_one_line(name, message):
    with pytest.raises(StabilityError) as caught:
        get_variant(name)
    assert message in str(caught.value) and "\n" not in str(caught.value)


def test_a_registered_name_cannot_hold_the_remedy_mark(isolated_registries):
    def builder(ctx):
        raise AssertionError("never built")

    with pytest.raises(StabilityError, match="reserved for remedied variants"):
        register_variant(builder, name="mine+clip")
    with pytest.raises(StabilityError, match="unknown variant 'mine'"):
        get_variant("mine+clip")


def test_a_remedy_is_one_decorated_function(isolated_registries):
    """A remedy registered in one place is in the doctor's table, with its own predicate's
    reason when it does not apply, and its case key in the command that reruns it."""
    from stability.doctor.remedies import command
    from stability.doctor.report import remedy_table
    from stability.doctor.run import applied_target
    from stability.model.remedy import case_remedy

    @case_remedy(
        key="hidden",
        family="model",
        label="a wider model",
        code="hidden * 2",
        helps={DIVERGENCE: "more room"},
        cannot="width is not range",
        applies=lambda target: "too wide" if target.before.hidden > 32 else None,
    )
    def wider(case):
        return case.hidden * 2

    assert list_remedies()[-1] is get_remedy("wider")
    assert "| `wider` | model | a wider model; in code: hidden * 2 |" in remedy_table()
    remedied = case_for(get_remedy("wider"), PLANTED, "raw_e", None, "planted__wider")
    assert remedied.hidden == 2 * PLANTED.hidden
    assert f"--set 'hidden={remedied.hidden}'" in command("c.toml", remedied, PLANTED)
    wide = replace(PLANTED, hidden=64)
    with pytest.raises(RemedyError, match="too wide"):
        applied_target(get_remedy("wider"), wide, replace(wide, hidden=128))


# --- data remedies ------------------------------------------------------------------------


@pytest.fixture(scope="module")
def far_dataset():
    return load_dataset(
        "generated",
        seed=0,
        num_graphs=40,
        distribution="outliers",
        min_distance=0.5,
        max_distance=4.0,
        max_outlier=400.0,
    )


def edges_of(graphs):
    return np.concatenate([g.edges.ravel() for g in graphs]).astype(np.float64)


def test_standardized_edges_have_the_training_set_s_mean_0_and_std_1(far_dataset):
    assert edges_of(far_dataset.train).min() > 0
    standard = transform_edges(far_dataset, "standardized")
    train = edges_of(standard.train)
    assert abs(train.mean()) < 1e-5 and train.std() == pytest.approx(1.0, rel=1e-4)
    assert train.min() < 0  # negative edges are allowed now
    mean, std = far_dataset.edge_mean, far_dataset.edge_std
    np.testing.assert_allclose(
        edges_of(standard.val), (edges_of(far_dataset.val) - mean) / std, rtol=1e-5, atol=1e-6
    )
    assert standard.key != far_dataset.key and far_dataset.key in standard.key
    assert [g.target for g in standard.train] == [g.target for g in far_dataset.train]


def test_squashed_edges_lie_between_0_and_1(small_dataset, far_dataset):
    squashed = transform_edges(small_dataset, "squashed")
    edges = edges_of(squashed.train + squashed.val)
    assert ((edges > 0) & (edges < 1)).all()
    np.testing.assert_allclose(
        edges, 1 / (1 + np.exp(-edges_of(small_dataset.train + small_dataset.val))), rtol=1e-6
    )
    far = edges_of(transform_edges(far_dataset, "squashed").train)
    assert ((far > 0) & (far <= 1)).all()  # a distance of 400 squashes to 1.0 in floats
    keys = {small_dataset.key, squashed.key, transform_edges(small_dataset, "standardized").key}
    assert len(keys) == 3


def test_the_case_key_edge_transform_reaches_the_data_and_refuses_a_bad_value():
    text = 'name = "e"\n[dataset]\nname = "synthetic"\nnum_graphs = 20\n'
    (plain,) = case_datasets(parse_case(text))
    (squashed,) = case_datasets(parse_case('edge_transform = "squashed"\n' + text))
    assert edges_of(plain.train).max() > 1 and edges_of(squashed.train).max() < 1
    with pytest.raises(CaseError) as caught:
        parse_case('edge_transform = "bogus"\n' + text)
    message = str(caught.value)
    assert "edge_transform" in message and "'bogus'" in message and "\n" not in message
    assert all(name in message for name in ("none", "standardized", "squashed"))


def in_degrees(graph):
    return np.bincount(graph.receivers, minlength=graph.num_nodes)


def test_self_loops_give_every_node_one_edge_from_itself_of_distance_0(far_dataset):
    looped = with_self_loops(far_dataset)
    assert far_dataset.isolated_nodes > 0 and looped.isolated_nodes == 0
    pairs = zip(far_dataset.train + far_dataset.val, looped.train + looped.val, strict=True)
    for before, after in pairs:
        n, m = before.num_nodes, before.num_edges
        assert after.num_edges == m + n
        np.testing.assert_array_equal(after.edges[:m], before.edges)  # the old edges first
        np.testing.assert_array_equal(after.senders[m:], np.arange(n))
        np.testing.assert_array_equal(after.receivers[m:], np.arange(n))
        assert (after.edges[m:] == 0).all()
        np.testing.assert_array_equal(in_degrees(after), in_degrees(before) + 1)
        assert after.target == before.target
    assert looped.key != far_dataset.key and far_dataset.key in looped.key


def test_the_case_key_self_loops_comes_before_the_edge_transform_and_refuses_a_bad_value():
    text = 'name = "e"\n[dataset]\nname = "synthetic"\nnum_graphs = 20\n'
    (plain,) = case_datasets(parse_case(text))
    (both,) = case_datasets(parse_case('self_loops = true\nedge_transform = "squashed"\n' + text))
    assert both.num_edges == plain.num_edges + sum(g.num_nodes for g in plain.train + plain.val)
    # The loops' distance 0 was squashed with the rest: sigmoid(0) = 0.5.
    graph = both.train[0]
    assert (graph.edges[-graph.num_nodes :] == 0.5).all()
    with pytest.raises(CaseError) as caught:
        parse_case('self_loops = "yes"\n' + text)
    message = str(caught.value)
    assert "self_loops" in message and "true or false" in message and "\n" not in message


def test_the_self_loop_remedy_is_tried_only_on_data_with_a_node_no_edge_enters(
    isolated_registries,
):
    @register_dataset
    def rings_test(*, seed: int = 0, lonely: bool = False):
        """Rings of 5 nodes, every node entered by one edge; ``lonely``: one more node that
        no edge enters in every graph."""
        rng = np.random.default_rng(seed)
        n = 6 if lonely else 5
        ring = np.arange(5, dtype=np.int32)
        graphs = [
            Graph(
                nodes=rng.normal(size=(n, 2)),
                edges=rng.uniform(0.5, 4.0, (5, 1)),
                senders=ring,
                receivers=np.roll(ring, 1),
                target=float(k),
            )
            for k in range(12)
        ]
        return Dataset.from_graphs(f"rings_test(seed={seed},lonely={lonely})", graphs, seed=seed)

    def self_loop_trial(lonely):
        case = Case(
            name="loops",
            variants=("raw_e",),
            seeds=(0,),
            batch_sizes=(4,),
            learning_rates=(0.01,),
            epochs=1,
            hidden=8,
            dataset="rings_test",
            dataset_params={"lonely": lonely},
        )
        original = Trial(ORIGINAL, diagnosed_case(case, "raw_e", None), ROOT)
        run = DoctorRun(case, "raw_e", original, find([failed(1)]), budget=3)
        return {t.remedy.name: t for t in plan(run)}["self_loops"]

    applied = self_loop_trial(lonely=True)
    assert applied.case is not None and applied.case.self_loops and not applied.reason
    refused = self_loop_trial(lonely=False)
    assert refused.case is None and "already has an incoming edge" in refused.reason
    assert get_remedy("self_loops").expected(OVERFLOW)
    assert not get_remedy("self_loops").expected(EXPLOSION)


# --- the doctor's own training ------------------------------------------------------------


def test_one_serial_sweep_trains_the_trials_of_equal_data_sets():
    # The doctor trains every remedy in one sweep, each with its own copy of the same data
    # (case_datasets per trial: equal Dataset objects, not the same one), serially unless
    # --workers is given. The sweep must tell the copies apart without comparing graphs.
    case = Case(
        name="two",
        variants=("raw_e",),
        seeds=(0,),
        batch_sizes=(16,),
        learning_rates=(0.01,),
        epochs=1,
        hidden=8,
        dataset="synthetic",
        dataset_params={"num_graphs": 24, "min_nodes": 3, "max_nodes": 5},
    )
    datasets = case_datasets(case) + case_datasets(case)
    assert datasets[0] is not datasets[1] and datasets[0].key == datasets[1].key
    (_, config), *_ = run_configs(case)
    configs = [(datasets[1], "raw_e+clip", config), (datasets[0], "raw_e", config)]
    results = execute_runs(configs, datasets, False, None, "remedies")
    assert [r.variant for r in results] == ["raw_e+clip", "raw_e"]


# --- the command line, end to end ---------------------------------------------------------

#: examples/my_gat.toml, smaller: distance outliers up to 400 overflow my_gat in epoch 1.
MY_GAT_CASE = """
name = "small_gat"
plugins = ["{plugin}"]
variants = ["my_gat"]
seeds = [0]
batch_sizes = [32]
learning_rates = [0.01]
epochs = 3

[model]
hidden = 8

[dataset]
name = "generated"
seed = 0
num_graphs = 64
distribution = "outliers"
min_distance = 0.5
max_distance = 4.0
max_outlier = 400.0
"""


def stability(*args):
    env = {**os.environ, "PYTHONPATH": str(ROOT), "TF_CPP_MIN_LOG_LEVEL": "2"}
    return subprocess.run(
        [sys.executable, "-m", "stability", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )


def my_gat_case(folder):
    path = folder / "small_gat.toml"
    path.write_text(MY_GAT_CASE.format(plugin=(ROOT / "examples" / "my_gat.py").as_posix()))
    return path


def read_csv(path):
    with path.open(newline="") as handle:
        return list(csv.DictReader(handle))


def one_line_error(done):
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("stability: error: "), done.stderr
    return lines[0]


@pytest.fixture(scope="module")
def doctored(tmp_path_factory):
    """One doctor of my_gat on the small case: (the process, its --out, the case file)."""
    folder = tmp_path_factory.mktemp("doctor")
    case = my_gat_case(folder)
    out = folder / "out"
    done = stability("doctor", str(case), "--variant", "my_gat", "--out", str(out))
    assert "Traceback" not in done.stderr, done.stderr
    return done, out, case


@pytest.mark.slow
@pytest.mark.xdist_group("doctor")
def test_the_exit_code_follows_the_doctor_csv_and_clipping_does_not_fix_the_overflow(doctored):
    done, out, _ = doctored
    rows = read_csv(out / "small_gat.doctor.csv")
    assert set(rows[0]) >= {
        "remedy",
        "runs",
        "avoided",
        "verdict",
        "first_failure_epoch",
        "final_mae",
    }
    by_remedy = {r["remedy"]: r for r in rows}
    registered = {r.name for r in list_remedies()}
    assert registered <= set(by_remedy)
    # The other rows are chains of op guards: a guard, then the next failing site's.
    for name in set(by_remedy) - registered:
        first, *sites = name.split("+")
        assert first in registered and sites and all("@" in s for s in sites), name
    fixed = any(r["verdict"] == FIXES for r in rows)
    assert done.returncode == (0 if fixed else 1), done.stderr
    # Issue 28: gradient clipping does not fix a forward overflow.
    assert by_remedy["clip"]["runs"] == "1"
    assert by_remedy["clip"]["verdict"] != FIXES
    assert by_remedy["clip"]["expected"] == "cannot help"
    # my_gat has no registered softmax: the softmax remedies cannot apply, and say why.
    assert by_remedy["stable_softmax"]["verdict"] == NOT_APPLICABLE
    assert "use_softmax" in by_remedy["stable_softmax"]["reason"]


@pytest.mark.slow
@pytest.mark.xdist_group("doctor")
def test_the_markdown_recommends_the_fix_the_csv_implies(doctored):
    done, out, _ = doctored
    rows = read_csv(out / "small_gat.doctor.csv")
    text = (out / "small_gat.doctor.md").read_text()
    assert "Symptom: **forward overflow**" in text
    fixes = [r for r in rows if r["verdict"] == FIXES]
    if not fixes:
        assert "No remedy fixed the forward overflow" in text and "Recommended:" not in text
        return

    # The rule (docs/doctor.md): the fixes that keep the original's best MAE, then the most
    # local class of fix, then the lowest final MAE.
    def order(r):
        ratio = r["mae_vs_original_best"]
        return (
            bool(ratio) and float(ratio) > 1,
            LOCALITY.index(r["fix_class"]),
            float(r["final_mae"]),
        )

    first = min(order(r) for r in fixes)
    expected = {r["remedy"] for r in fixes if order(r) == first}
    (recommended,) = [t for t in text.splitlines() if t.startswith("Recommended:")]
    named = recommended.split("**`")[1].split("`**")[0]
    assert named in expected, (recommended, expected)
    assert done.stderr.strip().splitlines()[-1].endswith(f"fixed by {named}")


@pytest.mark.slow
@pytest.mark.xdist_group("doctor")
def test_every_applied_remedy_has_its_own_store(doctored):
    _, out, _ = doctored
    runs = out / "small_gat.doctor"
    original = read_csv(runs / "small_gat__original.csv")
    assert [(r["variant"], r["seed"]) for r in original] == [("my_gat", "0")]
    assert (runs / "small_gat__original.runs.sqlite").is_file()
    for row in read_csv(out / "small_gat.doctor.csv"):
        store = runs / f"small_gat__{row['remedy']}"
        if row["verdict"] == NOT_APPLICABLE:
            assert not store.with_suffix(".runs.sqlite").exists(), row["remedy"]
            continue
        assert store.with_suffix(".runs.sqlite").is_file(), row["remedy"]
        held = read_csv(store.with_suffix(".csv"))
        assert len(held) == int(row["runs"]) == 1, row["remedy"]
        assert held[0]["variant"] == row["variant"] and held[0]["epochs"] == row["budget"]


@pytest.mark.slow
@pytest.mark.xdist_group("doctor")
def test_a_second_doctor_needs_resume_or_overwrite_and_resume_reruns_nothing(doctored):
    _, out, case = doctored
    runs = out / "small_gat.doctor"
    before = {p.name: p.read_bytes() for p in runs.glob("*.csv")}
    report = (out / "small_gat.doctor.csv").read_text()
    again = stability("doctor", str(case), "--variant", "my_gat", "--out", str(out))
    refused = one_line_error(again)
    assert "--resume" in refused and "--overwrite" in refused
    resumed = stability("doctor", str(case), "--variant", "my_gat", "--out", str(out), "--resume")
    assert "Traceback" not in resumed.stderr, resumed.stderr
    assert (out / "small_gat.doctor.csv").read_text() == report
    # A rerun would have written new rows (their wall_seconds) into a store's CSV.
    assert {p.name: p.read_bytes() for p in runs.glob("*.csv")} == before


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--variant", "my_gatt"], "Did you mean 'my_gat'?"),
        (["--variant", "my_gat", "--seeds", "x"], "--seeds 'x'"),
    ],
)
def test_bad_doctor_input_is_one_line_and_exit_2(tmp_path, flags, message):
    case = str(my_gat_case(tmp_path))
    done = run_cli("doctor", case, *flags, "--out", str(tmp_path / "out"), cwd=tmp_path)
    assert message in one_line_error(done)
    assert not (tmp_path / "out" / "small_gat.doctor").exists()


# --- beyond the seeds, and ops that fail in turn (issue 45) ---------------------------------


def with_fresh(run, name, fresh_rows):
    """Attach planted fresh-seed runs to the trial of ``name``."""
    trial = next(t for t in run.trials if t.remedy.name == name)
    trial.fresh = Trial(trial.remedy, trial.case, rows=fresh_rows)
    return trial


def test_a_fix_must_hold_on_the_fresh_seeds_too():
    run = planted_run({"float64": fine(1.0, 1.0, 1.0), "clip": fine(1.0, 1.0, 1.0)})
    # Held on the fresh seeds: still a fix.
    assert with_fresh(run, "float64", fine(1.0, 1.0)).verdict(run.finding) == FIXES
    # A fresh seed fails at epoch 2 (the original median): over all five runs the median
    # is beyond the budget, so it delays; failing on every fresh seed early, it only holds
    # on the seeds it was found on.
    clip = with_fresh(run, "clip", failing(2))
    assert clip.verdict(run.finding) == DELAYS
    clip.fresh.rows = [*failing(1, 1), *failing(1, 1, 1, 1)]
    assert clip.verdict(run.finding) == HOLDS_ON_THESE_SEEDS
    rows, lines = report(run)
    assert rows["float64"]["fresh_seeds"] == "0;1"
    assert rows["clip"]["fresh_failure_epochs"] == "1;1;1;1;1;1"
    assert "`float64` held on them too" in "\n".join(lines)
    assert "`clip` (holds on these seeds) failed on at least one of them" in "\n".join(lines)


def test_a_fix_must_hold_on_the_pushed_data_too(tmp_path):
    run = planted_run(
        {
            "float64": fine(1.0, 1.0, 1.0),
            "clip": fine(1.0, 1.0, 1.0),
            "larger_batch": fine(2.0, 2.0, 2.0),
            "lower_lr": failing(2),
        }
    )
    for name in ("float64", "clip", "larger_batch"):
        with_fresh(run, name, fine(1.0, 1.0))
    assert [t.remedy.name for t in run.fixes()] == ["clip", "larger_batch", "float64"]
    asked = []

    def push(case, folder):
        asked.append(case.variants[0])
        if case.batch_sizes != (16,):  # larger_batch holds; every other fix breaks
            return Pushed(False, "held through the hunt's 3 trainings")
        return Pushed(True, "failed at epoch 2", tmp_path / f"{case.name}.npz")

    pushed = push_fixes(run, push)
    # In the order recommended, until one holds: float64 is never pushed.
    assert [t.remedy.name for t in pushed] == ["clip", "larger_batch"]
    assert asked == [t.case.variants[0] for t in pushed]
    clip, larger = pushed
    assert clip.verdict(run.finding) == HOLDS_ON_THIS_DATA
    assert larger.verdict(run.finding) == FIXES
    assert run.recommended() is larger
    rows, lines = report(run)
    assert rows["clip"]["verdict"] == HOLDS_ON_THIS_DATA
    assert rows["clip"]["pushed"] == "failed at epoch 2"
    assert rows["float64"]["pushed"] == "" and rows["float64"]["verdict"] == FIXES
    assert (
        "The fixes, in the order recommended, were then pushed by the hunt, until one held: "
        "`clip` failed at epoch 2; `larger_batch` held through the hunt's 3 trainings."
    ) in lines


def test_a_failure_the_fix_does_not_treat_on_pushed_data_is_told_not_held_against_it():
    """Data pushed far enough breaks any model somewhere: a failure of another cause at
    another stage and layer leaves the fix a fix, and the report says what broke; the
    failure the fix treats, come back at its own site or by its own cause, does not."""
    run = planted_run({"clip": fine(1.0, 1.0, 1.0), "float64": fine(1.0, 1.0, 1.0)})
    for name in ("clip", "float64"):
        with_fresh(run, name, fine(1.0, 1.0))
    elsewhere = Pushed(
        True, "failed at epoch 1", stage="gradient", layer="dense", cause="gradient explosion"
    )
    [clip] = push_fixes(run, lambda case, folder: elsewhere)
    assert clip.pushed.another and clip.verdict(run.finding) == FIXES
    assert run.recommended() is clip
    rows, lines = report(run)
    assert rows["clip"]["pushed"] == (
        "failed at epoch 1: another failure (gradient explosion in gradient at dense) than the "
        f"one it fixes ({OVERFLOW} in forward at message_passing_0), not held against it"
    )
    assert "pushed by the hunt, until one held" in "\n".join(lines)
    for same in (
        replace(elsewhere, cause=OVERFLOW),  # its cause, elsewhere
        replace(elsewhere, stage="forward", layer="message_passing_0"),  # its site
    ):
        clip.pushed = None
        run.pushed.clear()
        pushed = push_fixes(run, lambda case, folder, same=same: same)
        assert not pushed[0].pushed.another
        assert pushed[0].verdict(run.finding) == HOLDS_ON_THIS_DATA


def test_when_every_pushed_fix_fails_the_report_says_none_held():
    run = planted_run({"float64": fine(1.0, 1.0, 1.0)})
    with_fresh(run, "float64", fine(1.0, 1.0))
    push_fixes(run, lambda case, folder: Pushed(True, "failed at epoch 1"))
    assert run.recommended() is None
    _, lines = report(run)
    assert "No fix held on the data the hunt pushed." in "\n".join(lines)
    # No fix, nothing pushed.
    nothing = planted_run({"clip": failing(1, 1, 1)})
    assert push_fixes(nothing, lambda *a: pytest.fail("pushed without a fix")) == []


def test_the_hunt_pushes_only_data_it_can_move(tmp_path):
    push = hunt_push(budget=1)
    molecules = replace(PLANTED, dataset="zoo_b_hco_molecules")
    pushed = push(molecules, tmp_path)
    assert not pushed.tried and "'zoo_b_hco_molecules'" in pushed.text
    squashed = replace(PLANTED, edge_transform="squashed")
    assert "transforms them" in push(squashed, tmp_path).text
    assert not list(tmp_path.iterdir())


@pytest.mark.slow
def test_the_hunt_breaks_a_fix_on_data_it_pushes_and_writes_that_data(tmp_path):
    """The seed's accepted fix, the weight-constrained Net, holds on cases/hunt.toml's own
    data at seed 0, and the hunt pushes the distances until it fails (docs/hunt.md); the
    data it failed on is written as a data set that reproduces it."""
    case = replace(load_case(ROOT / "cases" / "hunt.toml"), variants=("weight_constrained",))
    case = replace(case, seeds=(0,))
    pushed = hunt_push(budget=3)(case, tmp_path)
    assert pushed.tried and pushed.failed, pushed.text
    assert pushed.text.startswith("failed at epoch ") and "of the hunt's training" in pushed.text
    assert pushed.path == tmp_path / "hunt_hunt_weight_constrained.toml"
    (row,) = [r.row() for r in run_case(load_case(pushed.path), progress=False)]
    assert row["first_nan_epoch"] is not None, "the written case does not break the fix"


def test_a_forward_overflow_at_a_matmul_is_read_as_weight_growth():
    """An Inf first made by a MatMul is the updates' growth, not an exp's: the table then
    expects the step's bounds to help (b_pointgnn_sgd, fixed by clipping), not the exp
    remedies; an overflow at an Exp keeps the exp table."""
    run = planted_run({"clip": fine(1.0, 1.0, 1.0), "float64": failing(1, 1, 1)})
    assert run.finding.table_symptom == Cause.FORWARD_OVERFLOW.value
    rows, _ = report(run)
    assert rows["clip"]["expected"] == "cannot help" and rows["float64"]["expected"] == "helps"
    matmul = [{**r, "first_nan_op": "MatMul (dense_10/MatMul)"} for r in run.original.rows]
    run.original.rows = matmul
    run.finding = find(matmul)
    assert run.finding.symptom == Cause.FORWARD_OVERFLOW.value
    assert run.finding.table_symptom == WEIGHT_GROWTH
    rows, lines = report(run)
    assert rows["clip"]["expected"] == "helps" and rows["float64"]["expected"] == "cannot help"
    assert rows["clip"]["reason"] == get_remedy("clip").helps[WEIGHT_GROWTH]
    assert line(lines, "The forward overflow is at MatMul, which only multiplies and adds")
    assert "Symptom: **forward overflow**" in "\n".join(lines)
    # An op that is not linear keeps the cause's own table.
    both = [{**r, "first_nan_op": "MatMul (m) gradient: ExpGrad"} for r in matmul]
    assert find(both).table_symptom == Cause.FORWARD_OVERFLOW.value


def test_the_fresh_seeds_follow_the_largest_one_asked_for():
    assert fresh_seeds([0]) == (1, 2)
    assert fresh_seeds([3, 0, 7]) == (8, 9)


def test_only_a_fix_of_the_original_seeds_is_confirmed_on_fresh_seeds():
    run = planted_run({"float64": fine(1.0, 1.0, 1.0), "clip": failing(1, 1, 1)})
    made = confirmations([run])
    assert [t.remedy.name for t in made] == ["float64"]
    assert made[0].case.seeds == (3, 4) and made[0].case.name.endswith("__fresh")


def test_a_guard_at_a_layer_guards_every_layer_of_its_class(tmp_path):
    """The fix is a line of the layer's ``call``: ``guard_pow@gcn_layer`` guards
    gcn_layer_1 too, so a failure there gets no follow-up. Loads a zoo bug as the zoo's
    own tests do, without isolated_registries: that fixture keeps stability's modules
    imported and drops what they registered, so a later load_case of the bug in this
    process would find no variant."""
    from stability.doctor.run import begin, conclude, follow_ups
    from stability.zoo.run import BUGS, load_bug

    entry = load_bug(BUGS / "b_gcn_negative_weight.toml")
    run = begin(entry.case, entry.bug.variant, tmp_path)
    pow_in = {**failed(1, layer="gcn_layer"), "first_nan_op": "Pow (Pow)"}
    run.original.rows = [pow_in]
    conclude(run)
    guard = next(t for t in run.trials if t.remedy.name == "guard_pow")
    assert guard.case is not None and {s.op_type for s in guard.sites} == {"Pow"}
    # Both GCN layers' calls rewrote their Pow: the same line, once per layer.
    assert len(guard.sites) == 2 * len({(s.file, s.line) for s in guard.sites}), guard.sites
    guard.rows = [{**pow_in, "first_nan_layer": "gcn_layer_1"}]
    assert follow_ups(run) == []


class HalfPower(keras.layers.Layer):
    """``h * (sum |h|) ** -0.5``: the power of 0 is inf where a node's features are 0.
    Shapes: ``h`` ``[num_nodes, hidden]``; returns ``[num_nodes, hidden]``."""

    def call(self, h):
        return h * tf.pow(tf.reduce_sum(tf.abs(h), axis=-1, keepdims=True), -0.5)


class OtherHalfPower(keras.layers.Layer):
    """The same op in another class's ``call``: a guard of HalfPower does not reach it."""

    def call(self, h):
        return h * tf.pow(tf.reduce_sum(tf.square(h), axis=-1, keepdims=True), -0.5)


class SameCall(HalfPower):
    """A subclass that keeps HalfPower's ``call``: it runs the line a guard's fix changes."""


class TwoPowers(keras.Model):
    def __init__(self, hidden):
        super().__init__()
        self.embed = keras.layers.Dense(hidden, name="embed")
        self.first = HalfPower(name="first_power")
        self.second = OtherHalfPower(name="second_power")
        self.head = keras.layers.Dense(2, name="head")

    def call(self, inputs):
        h = self.second(self.first(self.embed(inputs["nodes"])))
        graph, count = inputs["node_graph"], inputs["num_graphs"]
        return self.head(tf.math.unsorted_segment_sum(h, graph, count))


def test_a_guard_whose_runs_fail_at_a_layer_of_another_class_gets_it_guarded_too(
    tmp_path, isolated_registries
):
    from stability.doctor.run import begin, conclude, follow_ups

    @register_variant
    def two_powers_test(ctx):
        """two layers of different classes, each with a power of -0.5"""
        return Recipe(TwoPowers(ctx.hidden), keras.optimizers.Adam(ctx.learning_rate))

    case = parse_case(TINY_CASE.replace('"raw_e", "stable_softmax"', '"two_powers_test"'))
    run = begin(case, "two_powers_test", tmp_path)
    pow_in = {**failed(1, layer="first_power"), "first_nan_op": "Pow (Pow)"}
    run.original.rows = [pow_in]
    conclude(run)
    guard = next(t for t in run.trials if t.remedy.name == "guard_pow")
    assert guard.case is not None
    guard.rows = [{**pow_in, "first_nan_layer": "second_power"}]  # the other class's Pow
    made = follow_ups(run)
    assert [t.case.variants[0] for t in made] == [
        "two_powers_test+guard_pow@first_power+guard_pow@second_power"
    ]
    assert made[0].remedy.name == "guard_pow+guard_pow@second_power"
    assert {s.guard for s in made[0].sites} == {"guard_pow"} and len(made[0].sites) >= 2
    assert follow_ups(run) == []  # each trial's failure is followed once
    # A chain that fails again at a site it guards gets no follow-up.
    made[0].rows = [{**pow_in, "first_nan_layer": "second_power"}]
    assert follow_ups(run) == []


def test_a_guard_reaches_the_layers_that_run_the_guarded_call_and_no_other():
    from stability.model.op_guard import sites

    model = TwoPowers(4)
    model.third = SameCall(name="third_power")
    recipe = Recipe(model, keras.optimizers.Adam(0.01))
    get_remedy("guard_pow").model(recipe, None, "first_power")
    h = tf.zeros((2, 4))
    for layer in (model.first, model.second, model.third):
        layer(h)
    assert sites(model.first) and sites(model.third), "the same call is guarded"
    assert not sites(model.second), "another class's call is not"


class ExpSoftmax(keras.layers.Layer):
    """``exp(h) / sum exp(h)`` over the features, written naively: the division shows the
    0 / 0 that the exp's underflow caused. Shapes: ``h`` ``[num_nodes, hidden]``; returns
    ``[num_nodes, hidden]``."""

    def call(self, h):
        e = tf.exp(h)
        return e / tf.reduce_sum(e, axis=-1, keepdims=True)


class SoftmaxNet(keras.Model):
    def __init__(self, hidden):
        super().__init__()
        self.embed = keras.layers.Dense(hidden, name="embed")
        self.softmax = ExpSoftmax(name="exp_softmax")
        self.head = keras.layers.Dense(2, name="head")

    def call(self, inputs):
        h = self.softmax(self.embed(inputs["nodes"]))
        graph, count = inputs["node_graph"], inputs["num_graphs"]
        return self.head(tf.math.unsorted_segment_sum(h, graph, count))


def test_the_guards_of_the_ops_feeding_the_failing_op_are_tried_after_its_own(
    tmp_path, isolated_registries
):
    """A 0 / 0 at the softmax's RealDiv is the Exp's underflow: the Exp's guards get trials
    in the failing layer (RANUM's inputs of the failing op), a guard of an op that feeds
    nothing there does not, and of two fixes the failing op's own guard comes first."""
    from stability.doctor.run import begin, conclude

    @register_variant
    def exp_softmax_test(ctx):
        """a naive softmax over the features"""
        return Recipe(SoftmaxNet(ctx.hidden), keras.optimizers.Adam(ctx.learning_rate))

    case = parse_case(TINY_CASE.replace('"raw_e", "stable_softmax"', '"exp_softmax_test"'))
    run = begin(case, "exp_softmax_test", tmp_path)
    division = {**failed(1, UNDERFLOW, layer="exp_softmax"), "first_nan_op": "RealDiv (truediv)"}
    run.original.rows = [division]
    conclude(run)
    assert run.producer_ops[0] == "Exp" and "Sum" in run.producer_ops, run.producer_ops
    trials = {t.remedy.name: t for t in run.trials}
    for name in ("guard_divide", "guard_exp_shift", "guard_exp_cap"):
        assert trials[name].case is not None, (name, trials[name].reason)
    assert {s.op_type for s in trials["guard_exp_shift"].sites} == {"Exp"}
    assert trials["guard_sqrt"].case is None
    assert trials["guard_sqrt"].reason.endswith("and no Sqrt feeds it in its layer")
    # A softmax over the features sums no segments: the segment shift has no ids there.
    segment = trials["guard_exp_segment_shift"]
    assert segment.case is None and segment.reason.endswith("feeds a segment reduction")
    trials["guard_divide"].rows = [finite(2.0)]
    trials["guard_exp_shift"].rows = [finite(1.0)]
    assert run.recommended() is trials["guard_divide"], "the failing op's guard first"
    chain = trials["guard_exp_shift"]
    chained = replace(chain.remedy, name="guard_exp_shift+guard_divide@exp_softmax")
    run.trials.append(Trial(chained, chain.case, chain.folder, rows=[finite(0.5)]))
    assert run.recommended() is trials["guard_divide"], "one guard before a chain"
    run.trials.pop()
    _, lines = report(run)
    sentence = line(lines, "In `exp_softmax` the failing RealDiv is fed by Exp")
    assert "`guard_exp_shift` (fixes)" in sentence and "`guard_divide`" not in sentence
    assert "Sum" not in sentence.partition(":")[0], "an op without a guard is counted, not named"
    trials["guard_divide"].rows = [division]
    assert run.recommended() is trials["guard_exp_shift"]


def test_a_failure_in_the_loss_gets_guards_in_the_loss(tmp_path):
    """A loss is no layer: a Square that overflows in the loss (mllam/neural-lam#537) gets
    the guards of the ops that feed it there, as ``guard@loss`` variants whose guarded ops
    are the user's loss's lines. Loads a zoo bug as the zoo's own tests do."""
    from stability.doctor.run import begin, conclude, follow_ups
    from stability.zoo.run import BUGS, load_bug

    entry = load_bug(BUGS / "b_softplus_logsigma.toml")
    run = begin(entry.case, entry.bug.variant, tmp_path)
    square = {
        **failed(1, Cause.LOSS.value, layer=""),
        "first_nan_where": "loss",
        "first_nan_op": "Square (Square)",
    }
    run.original.rows = [square]
    conclude(run)
    assert run.finding.site == "loss" and run.producer_ops[0] == "RealDiv", run.producer_ops
    trials = {t.remedy.name: t for t in run.trials}
    floor = trials["guard_divide_floor"]
    assert floor.case.variants == (f"{entry.bug.variant}+guard_divide_floor@loss",)
    assert {s.op_type for s in floor.sites} == {"RealDiv"}
    _, lines = report(run)
    assert line(lines, "In `loss` the failing Square is fed by RealDiv"), "the site, not None"
    assert all(s.file.endswith("b_softplus_logsigma.py") for s in floor.sites), floor.sites
    assert trials["guard_sqrt"].case is None
    # The guarded loss then fails at its Log: the follow-up guards it in the loss too.
    floor.rows = [{**square, "first_nan_op": "Log (Log)"}]
    made = [
        t.case.variants[0]
        for t in follow_ups(run)
        if t.remedy.name.startswith("guard_divide_floor+")
    ]
    assert f"{entry.bug.variant}+guard_divide_floor@loss+guard_log@loss" in made, made


def test_weights_that_do_not_sum_to_1_get_the_guards_of_their_layers_ops(tmp_path):
    """A normalization failure names its layer and no op (Graph-Learn's GATConv, whose
    softmax over a length-1 axis makes every weight 1): every op type the layer builds is a
    producer, so the segment softmax is tried there, reading the ids of the segment sum the
    weights feed, and the report names the layer's ops, not a failing op. Loads a zoo bug as
    the zoo's own tests do."""
    from stability.doctor.run import begin, conclude
    from stability.zoo.run import BUGS, load_bug

    entry = load_bug(BUGS / "s_graphlearn_gat_softmax.toml")
    run = begin(entry.case, entry.bug.variant, tmp_path)
    weights = {
        **failed(1, Cause.NORMALIZATION.value, layer="gat_conv"),
        "first_nan_op": "softmax normalization: weights sum to 2 at 8 of 39 nodes",
    }
    run.original.rows = [weights]
    conclude(run)
    assert not run.finding.ops and "Softmax" in run.producer_ops, run.producer_ops
    trials = {t.remedy.name: t for t in run.trials}
    segment = trials["guard_softmax_segment"]
    assert segment.case is not None, segment.reason
    assert {s.op_type for s in segment.sites} == {"Softmax"}
    assert {s.segments for s in segment.sites} == {"receivers"}, segment.sites
    assert segment.remedy.fix_class == "architecture change" and segment.remedy.is_op_guard
    assert trials["guard_exp_segment_shift"].case is None, "the layer builds no Exp"
    _, lines = report(run)
    assert "Softmax" in line(lines, "`gat_conv` computes its weights with")
