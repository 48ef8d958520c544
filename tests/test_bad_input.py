"""Bad data, cases and commands: each gets exactly one line on stderr and exit code 2.

The command runs in this process (``cli.main``), so the table costs no TensorFlow import
per row; tests/test_cli.py runs a few of the same through a real subprocess.
"""

import numpy as np
import pandas as pd
import pytest

from stability import cli
from stability.core.results import ADDED_RESULT_FIELDS, HISTORY_FIELDS, RESULT_FIELDS
from stability.data import Dataset, registry
from stability.data.graphs import Graph
from stability.model.variants import list_variants


def graph(edges=(1.0, 2.0), receivers=(1, 2), target=1.0):
    return Graph(
        nodes=np.eye(3),
        edges=np.array(edges, dtype=np.float64).reshape(-1, 1),
        senders=np.array([0, 1], np.int32),
        receivers=np.array(receivers, np.int32),
        target=target,
    )


# name -> the graph that spoils it; it is graph 1 (train: graph 0 and it, validation: graph 0).
BAD_GRAPHS = {
    "nan_edges": graph(edges=(1.0, np.nan)),
    "inf_edges": graph(edges=(np.inf, 1.0)),
    "neg_edges": graph(edges=(1.0, -1.0)),
    "dangling": graph(receivers=(1, 5)),
    "nan_target": graph(target=np.nan),
    "few_features": Graph(**{**graph().__dict__, "nodes": np.eye(3)[:, :2]}),
}


def builder(name):
    # Without a key, as a registered builder writes them: errors name the registry's key.
    def build(*, seed: int = 0) -> Dataset:
        if name == "empty":
            return Dataset(train=[], val=[])
        if name == "many_bad":  # graphs 1 and 2 in training, 4 in validation
            spoilt = [BAD_GRAPHS["nan_edges"], BAD_GRAPHS["nan_target"]]
            return Dataset(train=[graph(), *spoilt], val=[graph(), BAD_GRAPHS["inf_edges"]])
        return Dataset(train=[graph(), BAD_GRAPHS[name]], val=[graph()])

    return build


@pytest.fixture(autouse=True)
def bad_datasets(monkeypatch, tmp_path):
    monkeypatch.setattr(registry, "_datasets", registry._datasets.copy())
    for name in [*BAD_GRAPHS, "empty", "many_bad"]:
        registry._datasets.register(builder(name), name=name)
    monkeypatch.chdir(tmp_path)
    (tmp_path / "broken_plugin.py").write_text("raise RuntimeError('boom')\n")


def case_on(dataset, extra=""):
    return (
        f'variants = ["raw_e"]\nseeds = [0]\nepochs = 1\n{extra}\n[dataset]\nname = "{dataset}"\n'
    )


ALLOW = (
    "; set allow_nonfinite_input = true in the case to record such runs as first_nan_where = input"
)
VARIANTS = ", ".join(sorted(v.name for v in list_variants()))
HEADER = ",".join(RESULT_FIELDS)
RUN = ["run", "c.toml", "--out", "out", "--no-progress"]

# (files to create, command, the exact stderr line); {tmp} is the test's folder.
TABLE = [
    # flags
    pytest.param(
        {},
        ["claims", "--no-run", "--out", "no-such-claims-folder"],
        "--out no-such-claims-folder: no such folder; --no-run judges the claim cases' CSVs "
        "already there (seed.csv, batch_size.csv, learning_rate.csv)",
        id="claims-no-run-missing-folder",
    ),
    # data
    pytest.param(
        {"c.toml": case_on("nan_edges")},
        RUN,
        "data set nan_edges(seed=0): graph 1: edges hold non-finite distances" + ALLOW,
        id="data-nan-distance",
    ),
    pytest.param(
        {"c.toml": case_on("inf_edges")},
        RUN,
        "data set inf_edges(seed=0): graph 1: edges hold non-finite distances" + ALLOW,
        id="data-inf-distance",
    ),
    pytest.param(
        {"c.toml": case_on("neg_edges")},
        RUN,
        "data set neg_edges(seed=0): graph 1: edges hold negative distances (min -1)",
        id="data-negative-distance",
    ),
    pytest.param(
        {"c.toml": case_on("dangling")},
        RUN,
        "data set dangling(seed=0): graph 1: receivers points at node 5 (or 1), but the graph "
        "has 3 nodes",
        id="data-missing-node",
    ),
    pytest.param(
        {"c.toml": case_on("nan_target")},
        RUN,
        "data set nan_target(seed=0): graph 1: target nan is not finite" + ALLOW,
        id="data-nan-target",
    ),
    pytest.param(
        {"c.toml": case_on("few_features")},
        RUN,
        "data set few_features(seed=0): graph 1: nodes have 2 features, graph 0 has 3",
        id="data-feature-count",
    ),
    pytest.param(
        {"c.toml": case_on("empty")},
        RUN,
        "data set empty(seed=0): needs at least one training and one validation graph, got 0 and 0",
        id="data-empty",
    ),
    # cases
    pytest.param({}, RUN, "c.toml: no such case file", id="case-missing"),
    pytest.param(
        {"c.toml": "epochs = 0"},
        RUN,
        "c.toml: epochs = 0 is not valid; expected an integer > 0.",
        id="case-zero-epochs",
    ),
    pytest.param(
        {"c.toml": "learning_rates = [-0.1]"},
        RUN,
        "c.toml: learning_rates = [-0.1] is not valid; expected a non-empty list of numbers > 0.",
        id="case-negative-lr",
    ),
    pytest.param(
        {"c.toml": "[dataset]\nbox = 1e999"},
        RUN,
        "c.toml: dataset.box = inf is not valid; expected a float.",
        id="case-huge-float",
    ),
    pytest.param(
        {"c.toml": 'allow_nonfinite_input = "yes"'},
        RUN,
        "c.toml: allow_nonfinite_input = 'yes' is not valid; expected true or false.",
        id="case-allow-not-bool",
    ),
    # commands
    pytest.param(
        {"c.toml": case_on("nan_edges")},
        [*RUN, "--variants", "raw_ee"],
        f"unknown variant 'raw_ee'. Did you mean 'raw_e'? Known: {VARIANTS}. If your own "
        "module registers this variant, name it with --plugin my_module.py or "
        'plugins = ["my_module.py"] in the case file.',
        id="cmd-variant-typo",
    ),
    pytest.param(
        {"c.toml": case_on("nan_edges")},
        [*RUN, "--variants", " , "],
        "--variants ' , ': name at least one variant",
        id="cmd-no-variants",
    ),
    pytest.param(
        {"c.toml": case_on("nan_edges")},
        [*RUN, "--plugin", "no_such_module"],
        "plugin 'no_such_module' failed to import: ModuleNotFoundError: "
        "No module named 'no_such_module'",
        id="cmd-plugin-missing",
    ),
    pytest.param(
        {"c.toml": case_on("nan_edges")},
        [*RUN, "--plugin", "broken_plugin"],
        "plugin 'broken_plugin' failed to import: RuntimeError: boom",
        id="cmd-plugin-raises",
    ),
    pytest.param(
        {"c.toml": case_on("nan_edges"), "taken": ""},
        ["run", "c.toml", "--out", "taken"],
        "--out taken: cannot create the folder (File exists)",
        id="cmd-out-is-a-file",
    ),
    pytest.param(
        {"out/tiny.csv": "a,b\n1,2\n"},
        ["report", "out/tiny.csv"],
        "out/tiny.csv: not a results CSV; missing columns "
        + ", ".join(f for f in RESULT_FIELDS if f not in ADDED_RESULT_FIELDS),
        id="cmd-report-not-results",
    ),
    pytest.param({}, ["report", "."], ".: Is a directory", id="cmd-report-folder"),
    pytest.param({}, ["report", "absent.csv"], "absent.csv: no such results file", id="cmd-report"),
]


def write_files(root, files):
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


@pytest.mark.parametrize(("files", "argv", "message"), TABLE)
def test_bad_input_gets_exactly_one_line_and_exit_2(tmp_path, capsys, files, argv, message):
    write_files(tmp_path, files)
    code = cli.main(argv)
    err = capsys.readouterr().err
    assert code == 2
    # The variants known now: a plugin another test in this process loaded (my_gat) is
    # registered for the rest of the process, as a plugin is in a real one.
    known = ", ".join(sorted(v.name for v in list_variants()))
    expected = message.replace(VARIANTS, known).format(tmp=tmp_path)
    assert err == f"stability: error: {expected}\n"


@pytest.mark.parametrize(
    ("existing", "flags", "message"),
    [
        pytest.param(
            HEADER + "\n" + "tiny,raw_e,0,d,16,0.01" + "," * 15 + "\n",
            [],
            "out/tiny.csv already holds 1 run(s); pass --resume to keep them and run only the "
            "missing ones, --overwrite to discard them, or another --out",
            id="would-overwrite",
        ),
        pytest.param(
            "a,b\n1,2\n",
            ["--resume"],
            "out/tiny.csv: not a results file of this version; expected columns "
            + ", ".join(RESULT_FIELDS),
            id="resume-other-columns",
        ),
    ],
)
def test_an_existing_csv_is_never_overwritten(tmp_path, capsys, existing, flags, message):
    write_files(
        tmp_path,
        {
            "c.toml": case_on("nan_edges", 'name = "tiny"\nallow_nonfinite_input = true'),
            "out/tiny.csv": existing,
        },
    )
    code = cli.main([*RUN, *flags])
    assert code == 2
    assert capsys.readouterr().err == f"stability: error: {message}\n"
    assert (tmp_path / "out" / "tiny.csv").read_text() == existing


@pytest.mark.parametrize(
    ("argv", "error"),
    [
        (["run"], "python -m stability run: error: the following arguments are required: CASE"),
        (
            ["run", "c.toml", "--bogus"],
            "python -m stability: error: unrecognized arguments: --bogus",
        ),
        (["sweep"], "python -m stability: error: argument COMMAND: invalid choice: 'sweep'"),
        (
            ["run", "c.toml", "--resume", "--overwrite"],
            "python -m stability run: error: argument --overwrite: not allowed with argument",
        ),
    ],
)
def test_bad_flags_get_argparse_usage_and_one_error_line(capsys, argv, error):
    with pytest.raises(SystemExit) as info:
        cli.main(argv)
    assert info.value.code == 2
    # argparse's standard answer: the usage (wrapped over lines) and one error line
    *usage, last = capsys.readouterr().err.splitlines()
    assert usage[0].startswith("usage: python -m stability")
    assert all(line.startswith(" ") for line in usage[1:])
    assert last.startswith(error)


def test_debug_shows_the_traceback(capsys):
    assert cli.main(["--debug", *RUN]) == 2
    err = capsys.readouterr().err
    assert "Traceback (most recent call last)" in err
    assert err.endswith("stability: error: c.toml: no such case file\n")


def test_allowed_nonfinite_input_is_recorded_as_input_not_as_a_training_nan(tmp_path, capsys):
    write_files(tmp_path, {"c.toml": case_on("nan_edges", "allow_nonfinite_input = true")})
    assert cli.main(RUN) == 0, capsys.readouterr().err
    row = pd.read_csv(tmp_path / "out" / "c.csv").iloc[0]
    assert row["first_nan_where"] == "input"
    assert (row["first_nan_layer"], row["first_nan_op"]) == ("graph 1", "edges")
    assert pd.isna(row["first_nan_epoch"]), "an input NaN is not a training NaN"
    history = pd.read_csv(tmp_path / "out" / "c.history.csv")
    assert tuple(history.columns) == HISTORY_FIELDS and history.empty, "it was never trained"
    results = (tmp_path / "out" / "c.md").read_text().split("## Results")[1].splitlines()
    header = next(line for line in results if line.startswith("| variant"))
    values = next(line for line in results if line.startswith("| raw_e "))
    cells = {
        k.strip(): v.strip() for k, v in zip(header.split("|"), values.split("|"), strict=True)
    }
    assert cells["NaN in"] == "0/1"
    assert cells["NaN in input"] == "1/1"
    assert cells["where"] == "-"


def test_the_doctor_names_every_graph_of_an_input_failure(tmp_path, capsys):
    write_files(tmp_path, {"c.toml": case_on("many_bad", "allow_nonfinite_input = true")})
    code = cli.main(["doctor", "c.toml", "--variant", "raw_e", "--out", "out", "--no-progress"])
    assert code == 1, capsys.readouterr().err
    assert "holds NaN or Inf in 3 graphs" in capsys.readouterr().err
    report = (tmp_path / "out" / "c.doctor.md").read_text()
    assert "The first failure is in the input data, before any training: graph 1's edges" in (
        report
    )
    assert "3 of the 5 graphs do: graph 1 (edges), graph 2 (target), graph 4 (edges)." in report
    assert "nothing to doctor" not in report
