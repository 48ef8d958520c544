"""The pytest plugin, run inside a pytest session of its own (pytester)."""

import dataclasses
import os
import re
from pathlib import Path

import pandas as pd
import pytest
from conftest import TINY_CASE

from stability import Case
from stability.core.results import RESULT_FIELDS

ROOT = Path(__file__).parent.parent

USER_TEST = """
def test_my_variant(stability_run):
    results = stability_run("tiny.toml", variants=["stable_softmax"], epochs=1)
    assert [r.variant for r in results] == ["stable_softmax"]
    assert len(results[0].history) == 1
"""


def test_stability_report_writes_the_case_run_by_the_fixture(pytester, monkeypatch):
    # Not installed (PYTHONPATH=. only), the inner session needs the repository importable.
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    pytester.makefile(".toml", tiny=TINY_CASE)
    pytester.makepyfile(test_user=USER_TEST)
    out = pytester.path / "reports"
    result = pytester.runpytest_subprocess("-p", "stability.plugin", "--stability-report", str(out))
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines([f"stability: wrote {out / 'tiny.md'}"])
    frame = pd.read_csv(out / "tiny.csv")
    assert tuple(frame.columns) == RESULT_FIELDS
    assert list(frame["variant"]) == ["stable_softmax"] and list(frame["epochs"]) == [1]
    assert len(pd.read_csv(out / "tiny.history.csv")) == 1
    markdown = (out / "tiny.md").read_text()
    assert "| stable_softmax" in markdown and "(tiny.logits.png)" in markdown
    assert (out / "tiny.logits.png").stat().st_size > 0


def test_the_fixture_in_this_suite(stability_run, tmp_path):
    # The README's pattern, loaded by this suite's own `-p stability.plugin` (or, once the
    # project is installed, by the entry point): `pytest --stability-report DIR` reports it.
    case = tmp_path / "tiny.toml"
    case.write_text(TINY_CASE)
    results = stability_run(case, variants=["stable_softmax"], epochs=1)
    assert [(r.variant, r.epochs) for r in results] == [("stable_softmax", 1)]
    assert all(len(r.history) == 1 for r in results)


def test_a_mistyped_override_fails_the_test_in_one_line_naming_the_accepted(
    stability_run, tmp_path
):
    case = tmp_path / "tiny.toml"
    case.write_text(TINY_CASE)
    with pytest.raises(pytest.fail.Exception) as failed:
        stability_run(case, variants=["stable_softmax"], epoch=1)
    assert failed.value.pytrace is False  # pytest prints the message alone
    message = str(failed.value)
    assert "\n" not in message
    assert "unknown stability_run override 'epoch'. Did you mean 'epochs'?" in message
    known = message.split("Known: ", 1)[1].rstrip(".").split(", ")
    assert known == sorted(field.name for field in dataclasses.fields(Case))


def documented_block(doc: str, first_line: str) -> str:
    """The fenced python block of ``docs/<doc>`` that opens with ``first_line``."""
    text = (ROOT / "docs" / doc).read_text(encoding="utf-8")
    blocks = re.findall(r"```python\n(.*?)```", text, flags=re.S)
    [block] = [b for b in blocks if b.startswith(first_line + "\n")]
    return block


def test_the_documented_fixture_example_runs_in_a_fresh_folder(pytester, monkeypatch):
    """docs/testing.md's stability_run example, beside plugins.md's my_variants.py, as they
    stand there, in a folder with no case files: it trains the shipped SMALL_CASE, and,
    without ``--stability-report``, writes nothing."""
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    pytester.makepyfile(
        my_variants=documented_block("plugins.md", "# my_variants.py"),
        test_my_variants=documented_block("testing.md", "# test_my_variants.py"),
    )
    assert not list(pytester.path.rglob("*.toml"))
    # A subprocess: pytester's in-process run re-imports TensorFlow, which aborts.
    result = pytester.runpytest_subprocess("-p", "stability.plugin")
    result.assert_outcomes(passed=1)
    written = [
        path
        for pattern in ("*.md", "*.csv", "*.png")
        for path in pytester.path.rglob(pattern)
        if ".pytest_cache" not in path.parts  # pytest's own README.md
    ]
    assert not written, f"written without --stability-report: {written}"
