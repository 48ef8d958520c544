"""The doctor of broken invariants (``stability.doctor.invariant``, ``check --doctor``): a
model that breaks a property without a NaN is repaired by the remedies that change the
model, each proved by checking the remedied model again."""

from __future__ import annotations

import pytest
from conftest import run_cli
from test_check import check_args, planted_case

from stability.doctor.invariant import InvariantDoctor, Repair
from stability.model.remedy import get_remedy
from stability.report.verdicts import DOES_NOT_HELP, FIXES, HOLDS_ON_THIS_DATA, NOT_APPLICABLE
from stability.sweep.cases import load_case
from stability.zoo.report import repair_cells


def test_check_doctor_repairs_a_cancellation_and_finds_no_fix_for_batch_statistics(tmp_path):
    """The planted models of tests/data/check_planted.py were written before the variance
    guard: E[x^2] - E[x]^2 of values near 3000 (float32 keeps none of its digits) and a
    normalization by the whole batch's statistics (no remedy changes what is normalized)."""
    path = planted_case(tmp_path)
    out = tmp_path / "out"
    variants = ["planted_cancellation", "planted_batch_norm"]
    args = check_args(path, variants, ["dtype_agreement", "batch_independence"], out)
    done = run_cli("check", *args, "--doctor", cwd=tmp_path)
    assert done.returncode == 1, done.stderr  # the check's verdict: properties fail
    assert "planted_cancellation: recommended guard_variance_centered@planted_net" in done.stderr
    assert "planted_batch_norm: no remedy fixes it" in done.stderr
    text = (out / "planted.check.doctor.md").read_text()
    cancellation, batch_norm = text.split("## `planted_batch_norm`")
    assert "breaks `dtype_agreement`" in cancellation
    assert (
        "| `guard_variance_centered@planted_net` | stable reformulation | fixes |" in cancellation
    )
    assert "--variant planted_cancellation+guard_variance_centered@planted_net" in cancellation
    assert "breaks `batch_independence`" in batch_norm and "No remedy fixes it." in batch_norm
    # Remedies that act through training or change the data are named, not tried.
    assert "| `clip` | optimizer setting | not applicable | it acts through training" in text


@pytest.mark.slow
def test_check_doctor_centres_a_graph_norm_s_variance_on_each_graph_s_mean(tmp_path):
    """A per-graph variance written as segment means, E[x^2] - E[x]^2 of values near
    3000: the variance guard recomputes it from each node's deviation from its graph's
    mean, and its fix as code gathers the user's mean back to the nodes."""
    path = planted_case(tmp_path)
    out = tmp_path / "out"
    args = check_args(path, ["planted_segment_cancellation"], ["dtype_agreement"], out)
    done = run_cli("check", *args, "--doctor", cwd=tmp_path)
    assert done.returncode == 1, done.stderr
    assert "recommended guard_variance_centered@planted_net" in done.stderr
    text = (out / "planted.check.doctor.md").read_text()
    assert "| `guard_variance_centered@planted_net` | stable reformulation | fixes |" in text
    assert "tf.gather(mean, graph)" in text


def test_a_repair_s_verdict_follows_what_the_check_found_after_it(tmp_path):
    case = load_case(planted_case(tmp_path))

    def repair(broken, own=False, applies=True):
        remedy = get_remedy("guard_sqrt")
        return Repair(remedy, "net", case if applies else None, broken=broken, holds_own_data=own)

    assert repair({}).verdict == FIXES
    assert repair({"dtype_agreement": "generated: off"}, own=True).verdict == HOLDS_ON_THIS_DATA
    assert repair({"dtype_agreement": "own data: off"}).verdict == DOES_NOT_HELP
    assert repair(None).verdict == NOT_APPLICABLE
    assert repair({}, applies=False).verdict == NOT_APPLICABLE
    doctor = InvariantDoctor(case, "planted_clean", {"dtype_agreement": "x"}, ())
    chain = Repair(get_remedy("guard_sqrt"), "net", case, broken={})
    reformulation = Repair(get_remedy("guard_variance_centered"), "net", case, broken={})
    architecture = Repair(get_remedy("kernel_constraint"), None, case, broken={})
    doctor.repairs = [architecture, reformulation, chain, repair({"x": "own data: y"})]
    # The most local class first: an op guard, a reformulation, an architecture change.
    assert doctor.fixes() == [chain, reformulation, architecture]


def test_the_zoo_takes_the_check_s_repair_only_where_it_recommends_one():
    from stability.zoo.run import BUGS, load_bug

    bug = load_bug(BUGS / "s_spektral_attn_pool.toml").bug
    repair = {
        "recommended": "guard_softmax_segment",
        "layer": "pool",
        "fix_class": "architecture change",
        "code": "f.py:3: a => b",
        "verdicts": "guard_softmax_segment@pool:fixes",
    }
    cells = repair_cells(repair, bug)
    assert cells["doctor_fix"] == "guard_softmax_segment" and cells["fixed"] == "True"
    assert cells["fix_right"] == "True" and cells["doctor_fix_from"] == "check"
    assert cells["doctor_fix_code"] == "f.py:3: a => b"
    # A guard of another op than the bug's, of another class than its maintainers' fix.
    wrong = repair_cells({**repair, "recommended": "guard_sqrt"}, bug)
    assert wrong["fix_right"] == "False" and wrong["fixed"] == "True"
    none = repair_cells({**repair, "recommended": ""}, bug)
    assert "doctor_fix" not in none and none["check_repair_verdicts"] == repair["verdicts"]
    assert repair_cells(None, bug) == {"check_repair_verdicts": ""}
