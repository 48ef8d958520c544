"""``stability check``: each planted bug (tests/data/check_planted.py) breaks its property and
the check says so, with the failure named; the clean model and the correct built-in variants
pass; a counterexample is written as a case that fails again; bad input is one line."""

from __future__ import annotations

import io
import re
from pathlib import Path

import numpy as np
import pytest
from conftest import run_cli

from stability.check.outcome import FAIL, GENERATED, NOT_APPLICABLE, NOT_DECLARED, OWN_DATA, PASS
from stability.check.properties import PROPERTIES
from stability.check.run import Declared, check_variant
from stability.core.errors import StabilityError
from stability.core.invariants import INVARIANTS
from stability.sweep.cases import load_case
from stability.sweep.runner import run_case

PLANTED = Path(__file__).parent / "data" / "check_planted.py"

#: Fewer generated batches than the command's default: the planted bugs show in a few.
EXAMPLES = 20


def planted_case(tmp_path: Path, check_table: str = "") -> Path:
    """The small case (64 synthetic graphs of 3 to 7 nodes, distances in [0.5, 4]) with the
    planted variants, in float32: the planted models are written as float32 users write
    them (a float32 constant concatenated to the features), so under a mixed policy
    (STABILITY_DTYPE) they would fail to build, not break their property."""
    tmp_path.mkdir(parents=True, exist_ok=True)
    path = tmp_path / "planted.toml"
    path.write_text(
        f"""
name = "planted"
plugins = [{str(PLANTED)!r}]
variants = ["planted_clean"]
seeds = [0]
batch_sizes = [16]
learning_rates = [0.01]
epochs = 1
dtype = "float32"

[model]
hidden = 8

[dataset]
name = "synthetic"
num_graphs = 64
min_nodes = 3
max_nodes = 7
{check_table}
"""
    )
    return path


def verdicts(rows) -> dict[tuple[str, str], str]:
    return {(r.property, r.setting): r.status for r in rows}


@pytest.fixture(scope="module")
def case(tmp_path_factory):
    return load_case(planted_case(tmp_path_factory.mktemp("planted")))


# (variant, the property its bug breaks, the settings where the check must see it)
PLANTED_BUGS = [
    ("planted_node_index", "node_permutation", (OWN_DATA, GENERATED)),
    ("planted_first_edge", "edge_order", (OWN_DATA, GENERATED)),
    ("planted_batch_norm", "batch_independence", (OWN_DATA, GENERATED)),
    ("planted_hard_cutoff", "edge_continuity", (OWN_DATA, GENERATED)),
    ("planted_cancellation", "dtype_agreement", (OWN_DATA, GENERATED)),
    ("planted_unnormalized_attention", "attention_normalization", (OWN_DATA, GENERATED)),
]


@pytest.fixture(scope="module")
def checked(case):
    """``checked(variant, *props)``: the rows of ``check_variant(case, variant, examples=
    EXAMPLES, properties=props)``, checked once per module: the clean model, the reference
    of five planted bugs, is built and checked once for all five properties, and
    ``planted_first_edge``'s rows are the first of the determinism test's two checks."""
    done: dict[tuple[str, ...], list] = {}

    def rows(variant: str, *props: str) -> list:
        if (variant, *props) not in done:
            done[variant, *props] = check_variant(
                case, variant, examples=EXAMPLES, properties=list(props)
            )
        return done[variant, *props]

    return rows


#: The properties the clean model is the reference of (it exposes no attention).
CLEAN_PROPERTIES = [p for _, p, _ in PLANTED_BUGS if p != "attention_normalization"]


@pytest.mark.parametrize(("variant", "prop", "settings"), PLANTED_BUGS)
def test_a_planted_bug_breaks_its_property_and_the_clean_model_does_not(
    checked, variant, prop, settings
):
    broken = checked(variant, prop)
    # The clean model exposes no attention: the built-in stable softmax is the reference.
    if prop == "attention_normalization":
        clean = checked("stable_softmax", prop)
    else:
        clean = checked("planted_clean", *CLEAN_PROPERTIES)
    for setting in settings:
        assert verdicts(broken)[(prop, setting)] == FAIL, broken
        assert verdicts(clean)[(prop, setting)] == PASS, clean
    failing = [r for r in broken if r.failed]
    assert all(r.graphs and r.detail for r in failing)
    if prop != "attention_normalization":
        assert all(r.deviation > r.tolerance for r in failing)


@pytest.fixture(scope="module")
def exp_overflow_rows(case, tmp_path_factory):
    """``planted_exp_overflow``'s step in both settings, its failing batches written as
    cases naming the planted plugin: named by one test, run and checked again by another."""
    out = tmp_path_factory.mktemp("exp_overflow")
    return check_variant(
        case, "planted_exp_overflow", out, EXAMPLES, properties=["step"], plugins=[str(PLANTED)]
    )


def test_a_step_failure_is_named_as_training_names_it(exp_overflow_rows):
    rows = exp_overflow_rows
    assert [r.setting for r in rows] == [OWN_DATA, GENERATED]
    for row in rows:
        assert row.status == FAIL
        assert (row.stage, row.cause) == ("forward", "forward overflow"), row
        assert "Exp" in row.op
    # The generated counterexample is shrunk: one graph, with one edge at the largest distance.
    generated = next(r for r in rows if r.setting == GENERATED)
    assert (generated.graphs, generated.nodes) == (1, 2)


def test_a_counterexample_is_a_case_that_run_and_check_fail_again(exp_overflow_rows, tmp_path):
    (row,) = [r for r in exp_overflow_rows if r.setting == GENERATED]
    assert row.counterexample
    written = load_case(row.counterexample)
    (again,) = check_variant(
        written, "planted_exp_overflow", settings_=[OWN_DATA], properties=["step"]
    )
    assert (again.status, again.op) == (FAIL, row.op)
    (result,) = run_case(written, tmp_path / "run", progress=False)
    assert (result.first_nan_epoch, result.first_nan_step) == (1, 1)
    assert result.first_nan_where == "forward"


def test_a_declared_cutoff_is_checked_and_only_then(tmp_path):
    plain = load_case(planted_case(tmp_path))
    declared = load_case(planted_case(tmp_path / "d", "\n[check]\ncutoff = 4.0\n"))
    kwargs = {"examples": EXAMPLES, "properties": ["edge_continuity"], "settings_": [OWN_DATA]}
    assert check_variant(plain, "planted_partial_cutoff", **kwargs)[0].status == PASS
    (row,) = check_variant(declared, "planted_partial_cutoff", **kwargs)
    assert row.status == FAIL and "cutoff 4" in row.detail
    assert check_variant(declared, "planted_smooth_cutoff", **kwargs)[0].status == PASS
    # A model without any envelope does not vanish at the cutoff either.
    assert check_variant(declared, "planted_clean", **kwargs)[0].status == FAIL


def test_an_invariant_left_out_is_not_declared_and_not_checked(tmp_path):
    path = planted_case(tmp_path, '\n[check]\ninvariants = ["edge_order"]\n')
    rows = check_variant(load_case(path), "planted_node_index", examples=EXAMPLES)
    statuses = verdicts(rows)
    assert statuses[("node_permutation", OWN_DATA)] == NOT_DECLARED
    assert statuses[("edge_order", OWN_DATA)] == PASS
    assert statuses[("attention_normalization", OWN_DATA)] in (NOT_DECLARED,)
    assert {r.property for r in rows} == set(PROPERTIES)


def test_the_check_is_deterministic(case, checked):
    first = checked("planted_first_edge", "edge_order")  # maybe checked by an earlier test
    again = check_variant(case, "planted_first_edge", examples=EXAMPLES, properties=["edge_order"])
    strip = [{**r.as_dict(), "seconds": 0} for r in first]
    assert strip == [{**r.as_dict(), "seconds": 0} for r in again]


CORRECT = ["stable_softmax", "sigmoid_e", "normalized_e", "no_e", "grad_clip", "sigma_clip"]


@pytest.mark.parametrize("variant", CORRECT)
def test_no_false_alarm_on_a_correct_built_in_variant(variant):
    """The seed's correct variants (and the controls, whose bugs need training) pass every
    property on the small case; the attention ones are checked for their normalization."""
    from stability.testing import SMALL_CASE

    rows = check_variant(load_case(SMALL_CASE), variant, examples=EXAMPLES)
    assert not [r for r in rows if r.failed], [r for r in rows if r.failed]
    assert {r.status for r in rows} <= {PASS, NOT_APPLICABLE}


def test_every_invariant_has_a_planted_bug():
    assert {prop for _, prop, _ in PLANTED_BUGS} == set(INVARIANTS)


def check_args(
    path: Path, variants: list[str], properties: list[str], out: Path, workers: int = 1
) -> list[str]:
    """``check``'s arguments for ``variants`` and ``properties`` of the planted case, on 10
    examples, written to ``out``."""
    return [
        str(path),
        "--variant",
        ",".join(variants),
        "--properties",
        ",".join(properties),
        "--examples",
        "10",
        "--workers",
        str(workers),
        "--out",
        str(out),
    ]


@pytest.mark.parametrize(
    ("table", "says"),
    [
        ('invariants = ["symmetry"]', "check.invariants: 'symmetry' is not an invariant; accepted"),
        ("cutoff = -1", "check.cutoff"),
        ("smooth = true", "smooth"),
    ],
)
def test_a_bad_check_table_is_named(tmp_path, table, says):
    with pytest.raises(StabilityError, match=re.escape(says)):
        Declared.of(load_case(planted_case(tmp_path, f"\n[check]\n{table}\n")))


@pytest.mark.parametrize(
    ("extra", "table", "says"),
    [
        (["--variant", "nope"], "", "nope"),
        (["--properties", "symmetry"], "", "'symmetry' is not a property; accepted: step"),
        ([], '\n[check]\ninvariants = ["symmetry"]\n', "'symmetry' is not an invariant"),
        (["--doctor", "--trained"], "", "use --doctor or --trained, not both"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(tmp_path, extra, table, says):
    path = planted_case(tmp_path, table)
    done = run_cli("check", str(path), "--out", str(tmp_path / "out"), *extra, cwd=tmp_path)
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and says in lines[0], done.stderr
    assert not (tmp_path / "out" / "planted.check.csv").exists()


def test_the_command_writes_the_report_and_exits_1_on_a_failure(tmp_path):
    path = planted_case(tmp_path)
    out = tmp_path / "out"
    # In this process, on one worker: test_workers_give_the_rows_of_one_process starts two.
    variants = ["planted_first_edge", "planted_clean"]
    done = run_cli("check", *check_args(path, variants, ["edge_order"], out), cwd=tmp_path)
    assert done.returncode == 1, done.stderr
    text = (out / "planted.check.md").read_text()
    assert "1 of 2 variants pass every property" in text
    assert "`planted_first_edge` fails `edge_order`" in text
    csv = (out / "planted.check.csv").read_text().splitlines()
    assert len(csv) == 1 + 2 * 2
    assert list((out / "planted.check").glob("planted_first_edge.edge_order.*.toml"))


def test_the_fixture_fails_a_test_with_the_counterexample(stability_check, tmp_path):
    path = planted_case(tmp_path)
    kwargs = {"properties": ["edge_order"], "examples": 10}
    rows = stability_check(path, ["planted_first_edge"], expect_pass=False, **kwargs)
    assert {r.status for r in rows} == {FAIL}
    with pytest.raises(
        pytest.fail.Exception, match=r"planted_first_edge: edge_order fails .*\.toml"
    ):
        stability_check(path, ["planted_first_edge"], **kwargs)
    assert {r.status for r in stability_check(path, ["planted_clean"], **kwargs)} == {PASS}


def test_workers_give_the_rows_of_one_process(case, tmp_path):
    """Two worker processes check the variants and write the rows one process gives. The
    command runs in this process (``run_cli``): the two workers it spawns are real
    processes all the same, and a process of its own for the command would only start
    TensorFlow once more."""
    import pandas as pd

    path = planted_case(tmp_path)
    variants = ["planted_first_edge", "planted_batch_norm"]
    properties = ["edge_order", "batch_independence"]
    args = check_args(path, variants, properties, tmp_path / "out", workers=2)
    done = run_cli("check", *args, cwd=tmp_path)
    assert done.returncode == 1, done.stderr
    written = pd.read_csv(tmp_path / "out" / "planted.check.csv")
    here = load_case(path)
    rows = [
        r
        for v in variants
        for r in check_variant(
            here, v, tmp_path / "here", 10, properties=properties, plugins=[str(PLANTED)]
        )
    ]
    # Through a CSV as the command writes it, so that empty cells read back alike.
    expected = pd.read_csv(
        io.StringIO(pd.DataFrame([r.as_dict() for r in rows]).to_csv(index=False))
    )
    ignored = ["seconds", "counterexample"]
    pd.testing.assert_frame_equal(
        written.drop(columns=ignored), expected.drop(columns=ignored), check_dtype=False
    )


def test_trained_checks_the_weights_the_first_run_ends_with(case, monkeypatch):
    """The check with ``trained`` checks the weights its own training ended with: recorded
    as ``check_variant`` builds its subject (one training, not a second one alongside), and
    compared with the weights as built."""
    from stability.check import run
    from stability.sweep.runner import case_datasets

    subject_of = run._subject
    checked: list[tuple[bool, list]] = []

    def recorded(variant, dataset, config, trained):
        subject = subject_of(variant, dataset, config, trained)
        checked.append((trained, subject.recipe.model.get_weights()))
        return subject

    monkeypatch.setattr(run, "_subject", recorded)
    rows = check_variant(case, "planted_clean", examples=5, properties=["step"], trained=True)
    assert {r.status for r in rows} == {PASS}
    ((was_trained, trained),) = checked
    assert was_trained
    data, config = case_datasets(case)[0], run.first_config(case, "planted_clean")
    built = subject_of("planted_clean", data, config, trained=False).recipe.model.get_weights()
    assert len(built) == len(trained)
    assert any(not np.array_equal(b, t) for b, t in zip(built, trained, strict=True))
