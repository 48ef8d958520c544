"""Loading the user's own molecules: 10,000 small structures from one extxyz file into
graphs (``structures`` data set), in seconds per 1,000 structures.

The ways take turns round by round (``interleave``): the whole data set load, against
ASE's reading alone, so the table says how much of the time is the file format and how
much is the neighbour lists and graphs.
"""

import numpy as np
import pytest

pytest.importorskip("ase")

import ase.io
from ase.collections import g2
from ase.data import g2_1, g2_2
from conftest import NOTES, check_goal, interleave, record_samples

from stability.data import load_dataset

COUNT = 10_000
SECTION = "Loading 10,000 molecules from an extxyz file"
#: The stated goal: a file of 10,000 small molecules loads within a minute.
GOAL_SECONDS_PER_1000 = 6.0
NOTES[SECTION] = (
    f'`load_dataset("structures", ...)` on one extxyz file of {COUNT:,} molecules: the 148 '
    "multi-atom molecules of G2 (2 to 14 atoms), repeated with their atoms displaced by "
    "Gaussian noise of 0.05 Angstrom (seed 0), each with its enthalpy as the target; cutoff "
    "4 Angstrom. Against it, `ase.io.read` of the same file alone. 3 rounds after one warm-up; "
    "seconds per 1,000 structures."
)


@pytest.fixture(scope="module")
def molecules_file(tmp_path_factory):
    reference = {**g2_1.data, **g2_2.data}
    names = [name for name in g2.names if len(g2[name]) > 1]
    rng = np.random.default_rng(0)
    structures = []
    for k in range(COUNT):
        atoms = g2[names[k % len(names)]]
        atoms.positions += rng.normal(scale=0.05, size=atoms.positions.shape)
        atoms.info["enthalpy"] = float(reference[names[k % len(names)]]["enthalpy"])
        structures.append(atoms)
    path = tmp_path_factory.mktemp("molecules") / "molecules.extxyz"
    ase.io.write(path, structures)
    return path


def load_all(path):
    data = load_dataset("structures", path=str(path), target="enthalpy", seed=0)
    assert len(data.train) + len(data.val) == COUNT


def read_only(path):
    assert len(ase.io.read(path, index=":")) == COUNT


def test_loading_10000_molecules(molecules_file):
    ways = {
        "structures data set (read + neighbour lists + graphs)": (load_all, (molecules_file,)),
        "ase.io.read alone": (read_only, (molecules_file,)),
    }
    interleave(ways, rounds=1)
    measured = interleave(ways, rounds=3)
    for name, seconds in measured.items():
        record_samples(SECTION, name, seconds, COUNT // 1000, unit="s per 1,000 structures")
    per_1000 = float(np.median(measured[next(iter(ways))])) / (COUNT / 1000)
    check_goal(SECTION, "seconds per 1,000 structures", per_1000, "<=", GOAL_SECONDS_PER_1000)
