"""Write molecules.extxyz: the first 40 molecules of ASE's G2 collection that have more
than one atom, each with its tabulated enthalpy of formation (kcal/mol, ASE's g2_1/g2_2)
as ``info["enthalpy"]``. Run from anywhere: ``python examples/write_molecules.py``."""

from pathlib import Path

import ase.io
from ase.collections import g2
from ase.data import g2_1, g2_2

COUNT = 40

reference = {**g2_1.data, **g2_2.data}
molecules = []
for name in g2.names:
    atoms = g2[name]
    if len(atoms) > 1 and len(molecules) < COUNT:
        atoms.info["enthalpy"] = float(reference[name]["enthalpy"])
        atoms.info["name"] = name
        molecules.append(atoms)
ase.io.write(Path(__file__).with_name("molecules.extxyz"), molecules, format="extxyz")
