"""``stability.testing``, the public testing surface: its exports, its assertions, the one
meaning of each Hypothesis profile, and the deprecated paths it replaced.
"""

import importlib
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf
from hypothesis import settings

import stability
import stability.testing as testing
from stability.core.errors import StabilityError
from stability.core.results import RunResult
from stability.model.softmax import get_softmax
from stability.testing import assert_finite, assert_normalized
from stability.testing.profiles import CONFORMANCE_SHARE, PROFILE_VARIABLE, profile_name
from stability.testing.tolerance import sum_tolerance

ROOT = str(Path(__file__).resolve().parent.parent)


def test_the_package_exports_exactly_its_all():
    namespace: dict = {}
    exec("from stability.testing import *", namespace)
    exported = set(namespace) - {"__builtins__"}
    assert exported == set(testing.__all__)
    assert len(testing.__all__) == len(set(testing.__all__))


def test_the_top_level_conformance_names_are_the_testing_ones():
    for name in ("ConformanceReport", "Implementation", "check_segment_softmax"):
        assert getattr(stability, name) is getattr(testing, name), name
    assert stability.assert_segment_softmax_conforms is testing.assert_segment_softmax_conforms


# --- the deprecated paths -------------------------------------------------------------------


def fresh_import(name: str, monkeypatch) -> object:
    """Import ``name`` again, as a first import would, and return the module; the one
    warning names the old and the new path."""
    monkeypatch.delitem(sys.modules, name, raising=False)
    with pytest.warns(DeprecationWarning, match=r"stability\.testing") as record:
        importlib.import_module(name)
    deprecations = [w for w in record if issubclass(w.category, DeprecationWarning)]
    assert len(deprecations) == 1 and name in str(deprecations[0].message)
    return sys.modules[name]


def test_the_warning_points_at_the_importer():
    """``stacklevel=2``: the line that imports the old path, not the shim. In a process of
    its own, since under pytest the importer of a plugin's modules is pytest's hook."""
    run = subprocess.run(
        [
            sys.executable,
            "-W",
            "always::DeprecationWarning",
            "-c",
            "import stability.model.conformance",
        ],
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, "PYTHONPATH": ROOT},
    )
    assert "<string>:1: DeprecationWarning: stability.model.conformance is deprecated" in (
        run.stderr
    ), run.stderr


def test_the_old_conformance_path_warns_and_gives_the_same_objects(monkeypatch):
    old = fresh_import("stability.model.conformance", monkeypatch)
    shared = set(old.__all__) & set(testing.__all__)
    assert len(shared) >= 10, shared
    for name in shared:
        assert getattr(old, name) is getattr(testing, name), name
    from stability.testing import finite_range, inputs, tolerance

    assert old.span_text is finite_range.span_text
    assert old.tolerance_text is tolerance.tolerance_text
    assert old.DTYPES is inputs.DTYPES
    assert {p: testing.conformance_examples(p) for p in testing.PROFILE_NAMES} == old.PROFILES


def test_the_old_softmax_inputs_path_warns_and_gives_the_same_objects(monkeypatch):
    """docs/conformance.md named ``stability.model.softmax_inputs`` before it moved."""
    old = fresh_import("stability.model.softmax_inputs", monkeypatch)
    from stability.testing import inputs

    for name in ("DTYPES", "SoftmaxInput", "softmax_inputs", "reference_softmax"):
        assert getattr(old, name) is getattr(inputs, name), name


def test_the_old_adapters_path_warns_and_gives_the_same_objects(monkeypatch):
    old = fresh_import("stability.model.conformance_adapters", monkeypatch)
    from stability.testing import adapters

    assert old.__all__
    for name in old.__all__:
        assert getattr(old, name) is getattr(adapters, name), name


def test_the_new_paths_do_not_warn(monkeypatch, recwarn):
    for name in ("stability.testing.conformance", "stability.testing.adapters"):
        monkeypatch.delitem(sys.modules, name, raising=False)
        importlib.import_module(name)
    assert not [w for w in recwarn if issubclass(w.category, DeprecationWarning)]


# --- assertions -------------------------------------------------------------------------------


def test_assert_finite_passes_finite_values_and_shows_the_bad_ones():
    assert_finite(np.array([[0.0, -1e30], [1e-30, 2.0]]))
    with pytest.raises(AssertionError) as error:
        assert_finite(tf.constant([1.0, np.nan, 2.0, np.inf]), "alpha")
    message = str(error.value)
    assert message.startswith("alpha: 2 of 4 entries are not finite, first at (1,): nan, (3,): inf")
    assert "[1.0, nan, 2.0, inf]" in message


def stable_alpha(logits, receivers, num_nodes, dtype="float32"):
    """The harness's stable softmax, ``[num_edges, 1]``."""
    a = tf.constant(np.asarray(logits, dtype).reshape(-1, 1))
    return get_softmax("stable")(a, tf.constant(receivers), tf.constant(num_nodes))


@pytest.mark.parametrize("dtype", ["float16", "float32", "float64"])
def test_assert_normalized_passes_a_stable_softmax(dtype):
    rng = np.random.default_rng(0)
    receivers = np.array([0, 0, 0, 2, 2, 3] * 5, np.int32)  # node 1 and 4 receive nothing
    logits = rng.uniform(-50, 50, receivers.size)
    assert_normalized(stable_alpha(logits, receivers, 5, dtype), receivers, 5)


def test_assert_normalized_holds_to_the_stated_tolerance():
    receivers = np.array([0, 0, 1], np.int32)
    tolerance = float(sum_tolerance(np.float64, 2, 8))  # 2 edges into node 0
    assert_normalized(np.array([0.5, 0.5 + tolerance / 2, 1.0]), receivers)
    with pytest.raises(AssertionError, match=r"node 0 sums to 1\.0000000000000\d+"):
        assert_normalized(np.array([0.5, 0.5 + 2 * tolerance, 1.0]), receivers)


def test_assert_normalized_names_the_node_its_sum_and_its_weights():
    receivers = np.array([1, 0, 1, 1], np.int32)
    alpha = stable_alpha([0.0, 3.0, 1.0, 2.0], receivers, 2).numpy()
    alpha[2, 0] += 0.25
    with pytest.raises(AssertionError) as error:
        assert_normalized(alpha, receivers)
    message = str(error.value)
    assert re.search(r"at 1 of 2 receiving nodes: node 1 sums to 1\.2(5|49999)", message), message
    assert "for 3 edges), edges [0, 2, 3] with alpha [" in message, message


def test_assert_normalized_checks_each_head():
    receivers = np.array([0, 0, 1], np.int32)
    alpha = np.array([[0.5, 0.25], [0.5, 0.25], [1.0, 1.0]])  # head 1 sums to 0.5 at node 0
    assert_normalized(alpha[:, :1], receivers)
    with pytest.raises(AssertionError, match=r"attention \(head 1\) does not sum to 1"):
        assert_normalized(alpha, receivers)


def test_assert_normalized_leaves_masked_edges_out():
    receivers = np.array([0, 0, 0], np.int32)
    alpha = np.array([0.25, 0.75, 0.5], np.float32)  # the masked third edge is not 0
    assert_normalized(alpha, receivers, mask=np.array([True, True, False]))
    with pytest.raises(AssertionError, match=r"sums to 1\.5"):
        assert_normalized(alpha, receivers)


@pytest.mark.parametrize(
    ("alpha", "receivers", "message"),
    [
        pytest.param(np.ones((3, 2, 1)), np.zeros(3, int), r"shape \[3, 2, 1\]", id="3-d"),
        pytest.param(np.ones(2), np.zeros(3, int), r"shape \[2\] for receivers", id="short"),
        pytest.param(np.ones(3), np.zeros((3, 1), int), r"receivers of shape \[3, 1\]", id="2-d"),
    ],
)
def test_assert_normalized_refuses_the_wrong_shape(alpha, receivers, message):
    with pytest.raises(AssertionError, match=message):
        assert_normalized(alpha, receivers)


# --- the profiles ---------------------------------------------------------------------------


@pytest.mark.parametrize("name", testing.PROFILE_NAMES)
def test_each_profile_is_registered_once_with_one_meaning(name):
    """tests/conftest.py registered them: Hypothesis' profile is the package's, and the
    conformance suite's examples derive from its max_examples."""
    profile = testing.get_profile(name)
    assert settings.get_profile(name) is profile
    examples = testing.conformance_examples(name)
    assert examples == round(CONFORMANCE_SHARE * profile.max_examples)
    assert examples > 0


def test_the_loaded_profile_is_the_variable_s(monkeypatch):
    assert settings.default.max_examples == testing.get_profile().max_examples
    monkeypatch.setenv(PROFILE_VARIABLE, "thorough")
    assert profile_name() == "thorough"
    monkeypatch.delenv(PROFILE_VARIABLE)
    assert profile_name() == "ci"


def test_an_unknown_profile_is_one_line():
    with pytest.raises(StabilityError, match=re.escape("profile 'fast' is unknown; known: ci")):
        testing.get_profile("fast")


def test_a_conformance_report_counts_the_profile_s_examples():
    def numpy_softmax(logits, segment_ids, num_segments):
        return np.ones_like(logits)

    report = testing.check_segment_softmax(numpy_softmax, dtypes=("float64",), profile="ci")
    assert (report.profile, report.examples) == ("ci", testing.conformance_examples("ci"))


@pytest.mark.parametrize("variant", ["raw_e", "stable_softmax"])
def test_the_documented_check_on_a_network(tiny_dataset, variant):
    """docs/testing.md's example on the seed's network: each layer's alpha is finite and
    sums to 1 at every receiving node, and doubled it is not."""
    from stability import BuildContext, batch_graphs, get_variant

    context = BuildContext(
        num_features=tiny_dataset.train[0].nodes.shape[1],
        hidden=8,
        num_layers=2,
        learning_rate=1e-2,
        edge_mean=tiny_dataset.edge_mean,
        edge_std=tiny_dataset.edge_std,
    )
    tf.keras.utils.set_random_seed(0)
    model = get_variant(variant).build(context).model
    batch = batch_graphs(tiny_dataset.train[:8])
    out = model.forward(batch.as_inputs())
    assert len(out["alpha"]) == 2
    for alpha, receivers in zip(out["alpha"], out["receivers"], strict=True):
        assert_finite(alpha, "alpha")
        assert_normalized(alpha, receivers, batch.num_nodes)
        doubled = np.asarray(alpha) * 2
        with pytest.raises(AssertionError, match="does not sum to 1"):
            assert_normalized(doubled, receivers, batch.num_nodes)


# --- assert_runs_finite -----------------------------------------------------------------


def planted_run(**failure) -> RunResult:
    """A run's result with the failure columns given (none: it stayed finite)."""
    return RunResult(
        case="planted", variant="raw_e", seed=3, dataset="synthetic()", batch_size=16,
        learning_rate=0.01, epochs=5, dtype="float32", **failure,
    )  # fmt: skip


PLANTED_FAILURE = {
    "first_nan_epoch": 4,
    "first_nan_step": 37,
    "first_nan_where": "gradient",
    "first_nan_layer": "message_passing_1",
    "first_nan_op": "Exp (softmax_exp)",
    "failure_cause": "gradient explosion",
    "failure_kind": "normalization",
}


def test_finite_runs_pass_and_no_runs_fail():
    testing.assert_runs_finite([planted_run(), planted_run()])
    testing.assert_runs_finite(planted_run())  # one result alone
    with pytest.raises(AssertionError, match="no runs to check"):
        testing.assert_runs_finite([])


def test_a_failed_run_is_named_with_its_epoch_step_stage_layer_op_and_cause():
    failed = planted_run(**PLANTED_FAILURE)
    with pytest.raises(AssertionError) as error:
        testing.assert_runs_finite([planted_run(), failed])
    first, line = str(error.value).splitlines()
    assert first == "1 of 2 runs failed:"
    assert f"{failed.variant} seed={failed.seed}" in line
    for word, field in [
        ("epoch", "first_nan_epoch"),
        ("step", "first_nan_step"),
        ("stage", "first_nan_where"),
        ("layer", "first_nan_layer"),
        ("op", "first_nan_op"),
        ("cause", "failure_cause"),
        ("kind", "failure_kind"),
    ]:
        assert f"{word} {getattr(failed, field)}" in line, (field, line)


def test_a_real_failing_run_s_message(stability_run, tmp_path):
    """On a run the harness trained and diagnosed (raw_e on edge distances up to 1000),
    the message holds its columns."""
    from test_quiet import FAILING_CASE

    case = tmp_path / "failing.toml"
    case.write_text(FAILING_CASE)
    [run] = stability_run(case)
    assert run.first_nan_where and run.first_nan_layer and run.first_nan_op  # diagnosed
    with pytest.raises(AssertionError) as error:
        testing.assert_runs_finite([run])
    message = str(error.value)
    for value in (run.first_nan_epoch, run.first_nan_where, run.first_nan_layer):
        assert str(value) in message, message
    assert f"op {run.first_nan_op}, cause {run.failure_cause}" in message, message
    # docs/testing.md shows this very message.
    assert message in (Path(ROOT) / "docs" / "testing.md").read_text(encoding="utf-8"), message
