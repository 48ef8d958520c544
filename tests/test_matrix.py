""".ci/matrix.py: a tox --result-json file becomes rows of reports/matrix.csv, and
reports/matrix.md says, per env of `tox -l`, green, red or not run."""

import importlib.util
import json
import re
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

ROOT = Path(__file__).parent.parent
SPEC = importlib.util.spec_from_file_location("ci_matrix", ROOT / ".ci" / "matrix.py")
matrix = importlib.util.module_from_spec(SPEC)
SPEC.loader.exec_module(matrix)


def tox_result(envs: dict[str, tuple[str, int]]) -> dict:
    """A result file as tox 4 writes it: {env: (pytest's output, exit code)}."""
    return {
        "reportversion": "1",
        "toxversion": "4.67.17",
        "platform": "linux",
        "host": "localhost",
        "testenvs": {
            ".pkg": {"test": [], "setup": []},
            **{
                env: {
                    "python": {"version_info": [3, 12, 1, "final", 0]},
                    "installed_packages": [
                        "tensorflow==2.16.2",
                        "keras==3.3.3",
                        "hypothesis==6.100.0",
                        "stability @ file:///x",
                    ],
                    "result": {"success": code == 0, "exit_code": code, "duration": 1.0},
                    "test": [{"output": output, "retcode": code}],
                    "setup": [],
                }
                for env, (output, code) in envs.items()
            },
        },
    }


GREEN = "....\n1218 passed, 2 xfailed, 31 warnings in 693.12s (0:11:33)\n"
RED = "F.\n=== 10 failed, 888 passed, 1 error in 722.50s (0:12:02) ===\n"


@pytest.mark.parametrize(
    ("output", "expected"),
    [
        (GREEN, {"passed": 1218, "xfailed": 2, "failed": 0, "seconds": 693.12}),
        (RED, {"passed": 888, "failed": 10, "errors": 1, "seconds": 722.5}),
        ("ruff: All checks passed!\n", {}),
    ],
)
def test_pytests_counts_are_read_from_its_last_line(output, expected):
    counts = matrix.pytest_counts(output)
    assert {k: counts[k] for k in expected} == expected
    assert bool(counts) == bool(expected)


def test_an_env_tox_froze_no_packages_of_is_frozen_by_its_own_interpreter(tmp_path):
    """tox 4.67 leaves ``installed_packages`` out of some recreated envs: the versions come
    from a ``pip freeze`` by the interpreter the env's install step ran (here, this one)."""
    import hypothesis
    import keras

    report = tox_result({"py311-tf216-float32": (GREEN, 0)})
    env = report["testenvs"]["py311-tf216-float32"]
    del env["installed_packages"]
    env["setup"] = [{"command": [sys.executable, "-I", "-m", "pip", "install", "x"]}]
    result = tmp_path / "cells.json"
    result.write_text(json.dumps(report))
    (row,) = matrix.env_rows(result, "abc", "a cpu")
    assert (row["keras"], row["hypothesis"]) == (keras.__version__, hypothesis.__version__)
    env["setup"] = [{"command": [str(tmp_path / "gone" / "python"), "-I", "-m", "pip"]}]
    result.write_text(json.dumps(report))
    (row,) = matrix.env_rows(result, "abc", "a cpu")
    assert row["keras"] == "", "an env whose interpreter is gone has no versions to read"


def test_each_env_becomes_a_row_and_the_markdown_names_every_declared_cell(tmp_path):
    result = tmp_path / "cells.json"
    envs = {"py312-tf216-float64": (GREEN, 0), "py312-tflatest-float32": (RED, 1)}
    result.write_text(json.dumps(tox_result(envs)))
    rows = matrix.env_rows(result, "abc", "a cpu")
    assert [r["env"] for r in rows] == list(envs)
    assert rows[0]["tensorflow"] == "2.16.2" and rows[0]["python"] == "3.12.1"
    assert rows[0]["keras"] == "3.3.3" and rows[0]["hypothesis"] == "6.100.0"
    frame = matrix.merged(pd.DataFrame(columns=matrix.FIELDS), rows)
    declared = [*envs, "py313-tflatest-float32"]
    text = matrix.markdown(frame, declared)
    assert "Of the 3 env(s) `tox -l` declares, 1 ran green, 1 ran red and 1 have no record" in text
    assert "Red: py312-tflatest-float32." in text
    assert re.search(r"\| py313-tflatest-float32 +\| not run +\|", text)


def test_a_rerun_replaces_its_envs_row_and_keeps_the_others(tmp_path):
    first, second = tmp_path / "a.json", tmp_path / "b.json"
    first.write_text(json.dumps(tox_result({"lint": ("", 0), "py310-x": (RED, 1)})))
    second.write_text(json.dumps(tox_result({"py310-x": (GREEN, 0)})))
    frame = matrix.merged(pd.DataFrame(columns=matrix.FIELDS), matrix.env_rows(first, "a", "c"))
    frame = matrix.merged(frame, matrix.env_rows(second, "b", "c"))
    assert sorted(frame["env"]) == ["lint", "py310-x"]
    assert frame.set_index("env").loc["py310-x", "passed"] == 1218


def test_a_file_tox_did_not_write_is_one_line_and_exit_2(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    run = subprocess.run(
        [sys.executable, str(ROOT / ".ci" / "matrix.py"), str(bad), "--out", str(tmp_path)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert run.returncode == 2
    assert run.stderr.startswith(f"matrix: error: {bad}: not a tox --result-json file")
    assert len(run.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "matrix.csv").exists()


def declared_cells() -> list[tuple[str, str, str]]:
    """tox.ini's env_list, expanded as tox expands it: (python, tensorflow, dtype) per cell."""
    import configparser
    import itertools

    config = configparser.ConfigParser(interpolation=None)
    config.read(ROOT / "tox.ini")
    cells = []
    for line in config["tox"]["env_list"].split():
        choices = [p.strip("{}").split(",") for p in line.split("-")]
        cells += [c for c in itertools.product(*choices) if len(c) == 3]
    return cells


def test_the_matrix_covers_every_pair_of_python_tensorflow_and_dtype():
    cells = declared_cells()
    assert len(cells) == len(set(cells))
    pythons, tfs, dtypes = ({c[i] for c in cells} for i in range(3))
    assert pythons == {"py311", "py312", "py313"}
    assert tfs == {"tf216", "tflatest"} and dtypes == {"float32", "float64", "mixed_float16"}
    # TensorFlow 2.16 has no wheels for Python 3.13: the one pair that cannot run.
    impossible = {("py313", "tf216")}
    for i, j in ((0, 1), (0, 2), (1, 2)):
        wanted = {(a, b) for a in (pythons, tfs, dtypes)[i] for b in (pythons, tfs, dtypes)[j]}
        covered = {(c[i], c[j]) for c in cells}
        assert wanted - impossible <= covered, sorted(wanted - impossible - covered)
