"""What an install holds beside the modules: the package data a user's tests read
(``stability.testing.SMALL_CASE``), built into a wheel as ``pip install`` would."""

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

from stability.testing import SMALL_CASE

ROOT = Path(__file__).resolve().parent.parent


def test_the_wheel_ships_the_small_case(tmp_path):
    source = tmp_path / "source"
    source.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, source / name)
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    shutil.copytree(ROOT / "stability", source / "stability", ignore=ignore)
    # The setuptools already installed; no index: the wheel of this tree, nothing else.
    offline = ["--no-deps", "--no-build-isolation", "--no-index", "--quiet"]
    built = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", str(source), *offline, "-w", str(tmp_path / "d")],
        cwd=source,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert built.returncode == 0, built.stderr[-2000:]
    [wheel] = (tmp_path / "d").glob("*.whl")
    shipped = SMALL_CASE.relative_to(ROOT).as_posix()
    assert shipped in zipfile.ZipFile(wheel).namelist()
