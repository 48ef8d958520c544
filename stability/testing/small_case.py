"""``SMALL_CASE``: a case file shipped with the package that trains in seconds, so a test of
a user's own variant runs from any folder (``stability_run(SMALL_CASE, variants=[...])``).

The file is package data (``pyproject.toml``, ``[tool.setuptools.package-data]``).
"""

from __future__ import annotations

from pathlib import Path

#: The path of ``small_case.toml``: the seed's data set and model, shrunk to 64 graphs of 3
#: to 7 nodes, 8 hidden units, one seed, 10 epochs.
SMALL_CASE: Path = Path(__file__).with_name("small_case.toml")
