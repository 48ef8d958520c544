"""The command line, as a user runs it: a real subprocess each time, but for the reference
runs and re-renders that another test here already runs as a subprocess."""

import io
import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
from conftest import TINY_CASE, jit_agreement, run_cli

from stability import cli
from stability.core.results import RESULT_FIELDS

ROOT = Path(__file__).parent.parent


def stability(*args, cwd, python=()):
    """``python *python -m stability *args``: ``python`` holds the interpreter's own flags."""
    return python_code(*python, "-m", "stability", *args, cwd=cwd)


def python_code(*args, cwd):
    """``python *args`` with this tree importable, its output captured."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run(
        [sys.executable, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=300
    )


@pytest.fixture
def case_file(tmp_path):
    path = tmp_path / "tiny.toml"
    path.write_text(TINY_CASE)
    return path


def test_run_writes_csv_history_and_markdown(case_file, tmp_path):
    """Without --no-progress: a run into a pipe (this subprocess's stderr) draws no
    progress bar."""
    out = tmp_path / "out"
    done = stability("run", str(case_file), "--out", str(out), cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert "%|" not in done.stderr and "run/s" not in done.stderr, done.stderr[-2000:]
    frame = pd.read_csv(out / "tiny.csv")
    assert tuple(frame.columns) == RESULT_FIELDS
    assert sorted(frame["variant"]) == ["raw_e", "stable_softmax"]
    history = pd.read_csv(out / "tiny.history.csv")
    assert len(history) == 4  # 2 runs x 2 epochs
    markdown = (out / "tiny.md").read_text()
    assert "| raw_e" in markdown and "NaN in" in markdown

    # With the case, report renders the run's markdown again, the data sets' rows included.
    again = stability(
        "report",
        str(out / "tiny.csv"),
        "--case",
        str(case_file),
        "--out",
        str(tmp_path / "md"),
        cwd=tmp_path,
    )
    assert again.returncode == 0, again.stderr
    assert (tmp_path / "md" / "tiny.md").read_text() == markdown, "report must follow the CSV"
    # From the CSV alone it has no data sets to describe: the same report without their rows.
    # In this process: the subprocess above already showed `report` as a user runs it.
    assert cli.main(["report", str(out / "tiny.csv"), "--out", str(tmp_path / "alone")]) == 0
    text = (tmp_path / "alone" / "tiny.md").read_text()
    assert "graphs (train / validation)" in markdown and "graphs (train / validation)" not in text
    assert text.split("## Variants")[1] == markdown.split("## Variants")[1]


def test_jit_compile_flag_trains_with_xla_and_matches_the_plain_rows(
    case_file, tmp_path, monkeypatch
):
    outs = {}
    for flags in ([], ["--jit-compile"]):
        out = tmp_path / ("jit" if flags else "plain")
        args = ["run", str(case_file), "--out", str(out), "--no-progress", *flags]
        if flags:  # the flag through a real subprocess, as a user passes it
            done = stability(*args, cwd=tmp_path)
            assert done.returncode == 0, done.stderr
        else:  # the plain reference in this process (test_run_writes_... runs it as above)
            monkeypatch.chdir(tmp_path)
            assert cli.main(args) == 0
        outs[bool(flags)] = pd.read_csv(out / "tiny.csv")
    jit, plain = outs[True], outs[False]
    assert "Trained with `jit_compile` (XLA)" in (tmp_path / "jit" / "tiny.md").read_text()
    assert "jit_compile" not in (tmp_path / "plain" / "tiny.md").read_text()
    # `report --case` of a jit case keeps the note.
    case_file.write_text(
        case_file.read_text().replace("epochs = 2", "epochs = 2\njit_compile = true")
    )
    assert cli.main(["report", str(tmp_path / "jit" / "tiny.csv"), "--case", str(case_file)]) == 0
    assert "Trained with `jit_compile` (XLA)" in (tmp_path / "jit" / "tiny.md").read_text()
    assert list(jit["variant"]) == list(plain["variant"])
    # XLA fuses ops on padded batches: the same runs, up to the last bits of the dtype.
    pd.testing.assert_series_equal(jit["best_mae"], plain["best_mae"], rtol=jit_agreement())


def test_list_prints_every_variant(tmp_path):
    done = run_cli("list", cwd=tmp_path)
    assert done.returncode == 0
    for name in [
        "raw_e",
        "sigmoid_e",
        "normalized_e",
        "weight_constrained",
        "stable_softmax",
        "no_e",
        "relu_e",
        "grad_clip",
        "sigma_clip",
    ]:
        assert name in done.stdout


def test_plugin_variant_can_be_named_in_a_case(case_file, tmp_path, isolated_registries):
    (tmp_path / "my_variants.py").write_text(
        "from stability import register_variant, create_recipe\n"
        "@register_variant\n"
        "def my_sigmoid_stable(ctx):\n"
        "    '''sigmoid(e) and the stable softmax'''\n"
        "    return create_recipe(ctx, edge_mode='sigmoid', softmax='stable')\n"
    )
    case_file.write_text(TINY_CASE.replace('"stable_softmax"', '"my_sigmoid_stable"'))
    out = tmp_path / "out"
    done = stability(
        "run",
        str(case_file),
        "--out",
        str(out),
        "--no-progress",
        "--plugin",
        "my_variants",
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr
    assert "my_sigmoid_stable" in set(pd.read_csv(out / "tiny.csv")["variant"])
    # In this process (conftest.run_cli): the run above loaded the plugin as a user does.
    listed = run_cli("list", "--plugin", "my_variants", cwd=tmp_path)
    assert "sigmoid(e) and the stable softmax" in listed.stdout


@pytest.mark.parametrize(
    ("args", "message"),
    [
        pytest.param(["run", "absent.toml"], "absent.toml: no such case file", id="missing"),
        pytest.param(
            ["run", "tiny.toml", "--variants", "raw_ee"], "Did you mean 'raw_e'?", id="variant"
        ),
        pytest.param(
            ["run", "tiny.toml", "--plugin", "no_such_module"],
            "plugin 'no_such_module' failed to import",
            id="plugin",
        ),
        pytest.param(["report", "absent.csv"], "absent.csv: no such results file", id="report"),
    ],
)
def test_bad_input_gets_one_line_and_exit_2(case_file, tmp_path, args, message):
    # One through a real process, the others in this one (conftest.run_cli says why).
    done = (stability if args[1] == "absent.toml" else run_cli)(*args, cwd=tmp_path)
    assert done.returncode == 2
    assert message in done.stderr
    assert "Traceback" not in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr


# --- what starts TensorFlow ---------------------------------------------------------------


#: Runs ``python -m stability`` with the arguments given, then prints at exit which of
#: TensorFlow and Keras it imported. (``-X importtime`` cannot tell: the CLI silences file
#: descriptor 2 while TensorFlow loads, and importtime's lines with it.)
HEAVY_AT_EXIT = """
import atexit, runpy, sys

def heavy():
    print("heavy:", ",".join(sorted({"tensorflow", "keras"} & set(sys.modules))) or "neither")

atexit.register(heavy)
runpy.run_module("stability", run_name="__main__", alter_sys=True)
"""


@pytest.mark.parametrize("args", [["--help"], ["--version"], ["run", "--help"]], ids=" ".join)
def test_help_and_version_answer_without_importing_tensorflow(tmp_path, args):
    """TensorFlow takes seconds to import: a command that only prints must not wait for it."""
    done = python_code("-c", HEAVY_AT_EXIT, *args, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "python -m stability" in done.stdout  # the usage, or the version line
    assert done.stdout.splitlines()[-1] == "heavy: neither"


def test_a_command_imports_tensorflow_once_it_runs(tmp_path):
    """The probe above sees TensorFlow where a command loads it (``list`` needs the
    registries, which build Keras layers)."""
    done = python_code("-c", HEAVY_AT_EXIT, "list", cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.splitlines()[-1] == "heavy: keras,tensorflow"


WHAT_EVERY_HELP_IMPORTS = """
import sys
from stability import cli

for command in cli.COMMANDS:
    try:
        cli.main([command, "--help"])
    except SystemExit:
        pass
print(",".join(sorted({"tensorflow", "keras"} & set(sys.modules))) or "neither")
"""


def test_no_command_s_help_imports_tensorflow(tmp_path):
    done = python_code("-c", WHAT_EVERY_HELP_IMPORTS, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.count("usage: python -m stability") == len(cli.COMMANDS)
    assert done.stdout.splitlines()[-1] == "neither"


# --- progress bars ------------------------------------------------------------------------


class Stderr(io.StringIO):
    def __init__(self, terminal: bool):
        super().__init__()
        self.terminal = terminal

    def isatty(self) -> bool:
        return self.terminal


@pytest.mark.parametrize("terminal", [True, False], ids=["terminal", "pipe"])
@pytest.mark.parametrize("flags", [[], ["--no-progress"]], ids=["default", "no-progress"])
def test_progress_bars_are_drawn_only_on_a_terminal(monkeypatch, terminal, flags):
    from stability.commands.flags import show_progress

    for command in ("run", "map", "claims", "spread", "hunt"):
        target = [] if command == "claims" else ["c.toml"]
        extra = ["--variant", "raw_e"] if command == "hunt" else []
        args = cli._parser().parse_args([command, *target, *extra, *flags])
        monkeypatch.setattr(sys, "stderr", Stderr(terminal))
        assert show_progress(args) is (terminal and not flags), command
