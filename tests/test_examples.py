"""What a new user does: the walkthrough of docs/plugins.md, as it stands there, through
the command line in a fresh folder; and examples/, through the same command line."""

import os
import re
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

pytest.importorskip("ase")

import ase.io
from ase.calculators.singlepoint import SinglePointCalculator
from ase.collections import g2

from stability import cli

ROOT = Path(__file__).resolve().parent.parent
PLUGINS_DOC = ROOT / "docs" / "plugins.md"
WALKTHROUGH = "## Your molecules and your fix, in one minute"
#: Short runs: the walkthrough's own command, then these (a later --set wins).
TINY = ["--set", "epochs=2", "--set", "seeds=[0]", "--no-progress"]


def walkthrough_blocks() -> dict[str, str]:
    """The walkthrough's fenced blocks, keyed by language."""
    text = PLUGINS_DOC.read_text()
    section = text[text.index(WALKTHROUGH) :]
    section = section[: section.index("\n## ", 1)]
    return dict(re.findall(r"```(\w+)\n(.*?)```", section, flags=re.S))


def test_the_walkthrough_is_at_most_30_lines():
    blocks = walkthrough_blocks()
    assert set(blocks) == {"toml", "python", "bash"}
    # Each block's lines plus its two fences.
    assert sum(block.count("\n") + 2 for block in blocks.values()) <= 30


def test_a_user_runs_the_walkthrough_in_a_fresh_folder(tmp_path):
    blocks = walkthrough_blocks()
    # The user's own file: 24 G2 molecules with a made-up energy in the extxyz header.
    molecules = [g2[name] for name in g2.names if len(g2[name]) > 1][:24]
    for atoms in molecules:
        atoms.calc = SinglePointCalculator(atoms, energy=-0.5 * len(atoms) + atoms.numbers.sum())
    ase.io.write(tmp_path / "molecules.extxyz", molecules)
    (tmp_path / "my_case.toml").write_text(blocks["toml"])
    (tmp_path / "my_fixes.py").write_text(blocks["python"])
    command = blocks["bash"].split()
    assert command[:3] == ["python", "-m", "stability"]
    done = subprocess.run(
        [sys.executable, *command[1:], *TINY],
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr
    rows = pd.read_csv(tmp_path / "reports" / "my_case.csv")
    assert sorted(rows["variant"]) == ["raw_e", "stable_softmax", "tanh_logit"]
    assert rows["dataset"].str.startswith("structures(path='molecules.extxyz',").all()
    report = (tmp_path / "reports" / "my_case.md").read_text()
    assert "| tanh_logit" in report
    assert "naive softmax on logits squashed" in report  # the variant's docstring
    assert "`--set epochs=20` `--set epochs=2` `--set seeds=[0]`" in report


def test_the_example_trains_from_another_folder(tmp_path, monkeypatch, capsys, isolated_registries):
    monkeypatch.chdir(tmp_path)  # its paths are relative to the case file, not to here
    case = ROOT / "examples" / "my_molecules.toml"
    assert cli.main(["run", str(case), "--out", "out", *TINY]) == 0, capsys.readouterr().err
    rows = pd.read_csv(tmp_path / "out" / "my_molecules.csv")
    assert sorted(rows["variant"]) == ["raw_e", "stable_softmax", "tanh_logit"]
    assert rows["dataset"].str.contains("target='enthalpy'").all()


def test_the_example_file_is_what_its_script_writes(tmp_path):
    script = (ROOT / "examples" / "write_molecules.py").read_text()
    copy = tmp_path / "write_molecules.py"
    copy.write_text(script)
    subprocess.run([sys.executable, str(copy)], check=True, timeout=120)
    written = ase.io.read(tmp_path / "molecules.extxyz", index=":")
    committed = ase.io.read(ROOT / "examples" / "molecules.extxyz", index=":")
    assert len(written) == len(committed) == 40
    for a, b in zip(written, committed, strict=True):
        assert a.get_chemical_formula() == b.get_chemical_formula()
        assert a.info["enthalpy"] == b.info["enthalpy"]
