"""The run store: rows that survive a kill, one writer at a time per folder.

- ``RunStore`` keeps ``<case>.csv`` and ``<case>.history.csv`` of a sweep: each finished
  run's rows are appended and fsynced before the next run starts; ``resume`` skips runs
  already there. All writes into an output folder hold that folder's lock
  (``.stability.lock``, a ``filelock.FileLock``), so sweeps in other processes writing into
  the same folder wait for each other instead of interleaving.
"""

from __future__ import annotations

import contextlib
import csv
import io
import math
import os
from collections.abc import Iterable, Sequence
from pathlib import Path

from stability.core.errors import StabilityError
from stability.core.files import TEMP_SUFFIX, atomic_write_text, folder_lock
from stability.core.results import HISTORY_FIELDS, RESULT_FIELDS, RunResult

#: The columns that name one run: a case also sweeps batch sizes and learning rates, so
#: they belong to the key beside case, variant, seed and data set.
RUN_KEY = ("case", "variant", "seed", "dataset", "batch_size", "learning_rate")

_NUMERIC_KEY = {"seed": int, "batch_size": int, "learning_rate": float, "epoch": int}


def run_key(row: dict[str, object]) -> tuple[str, ...]:
    """The key of a result row, as the CSV spells it."""
    return tuple(_cell(row[name]) for name in RUN_KEY)


class RunStore:
    """The CSV and history CSV of one case in ``out_dir``, written run by run.

    Without ``resume``, a CSV that already holds rows is an error (nothing is silently
    overwritten); with it, the runs already there are skipped (``done``); ``overwrite``
    starts both files afresh, deliberately discarding their rows. ``settings``
    (columns outside ``RUN_KEY``, such as epochs and dtype) must match the rows resumed.
    """

    def __init__(
        self,
        out_dir: Path,
        case: str,
        resume: bool = False,
        settings: dict[str, object] | None = None,
        overwrite: bool = False,
    ):
        self.out_dir = Path(out_dir)
        self.csv = self.out_dir / f"{case}.csv"
        self.history = self.out_dir / f"{case}.history.csv"
        try:
            self.out_dir.mkdir(parents=True, exist_ok=True)
            with folder_lock(self.out_dir):
                _remove_stale_temps(self.out_dir)
                rows = self._open(resume, overwrite)
        except OSError as exc:
            raise StabilityError(f"{self.out_dir}: cannot write results ({exc})") from None
        for name, value in (settings or {}).items():
            other = {row[name] for row in rows} - {_cell(value)}
            if other:
                raise StabilityError(
                    f"{self.csv} holds runs with {name} = {sorted(other)[0]}, this case has "
                    f"{name} = {value}; --resume cannot mix them, choose another --out"
                )
        self.done: set[tuple[str, ...]] = {run_key(row) for row in rows}

    def _open(self, resume: bool, overwrite: bool) -> list[dict[str, str]]:
        rows = [] if overwrite else _read_rows(self.csv, RESULT_FIELDS)
        if rows and not resume:
            raise StabilityError(
                f"{self.csv} already holds {len(rows)} run(s); pass --resume to keep them and "
                "run only the missing ones, --overwrite to discard them, or another --out"
            )
        if not rows:
            for path, fields in ((self.csv, RESULT_FIELDS), (self.history, HISTORY_FIELDS)):
                atomic_write_text(path, _render([], fields))
        return rows

    def add(self, result: RunResult) -> None:
        """Append ``result``'s row and history, durably; a run another process finished
        meanwhile is not written twice."""
        with folder_lock(self.out_dir):
            if run_key(result.row()) in {run_key(r) for r in _read_rows(self.csv, RESULT_FIELDS)}:
                return
            # History first: a kill between the two appends leaves a run without a result
            # row, which --resume runs again (its history rows are then replaced).
            _append(self.history, HISTORY_FIELDS, result.history_rows())
            _append(self.csv, RESULT_FIELDS, [result.row()])
        self.done.add(run_key(result.row()))

    def finish(self) -> None:
        """Rewrite both files atomically in canonical order (sorted by ``RUN_KEY``), keeping
        one copy of each run (and the history of runs that have a result row)."""
        with folder_lock(self.out_dir):
            rows = _unique(_read_rows(self.csv, RESULT_FIELDS), run_key)
            keys = {run_key(r) for r in rows}
            history = [h for h in _read_rows(self.history, HISTORY_FIELDS) if run_key(h) in keys]
            history = _unique(history, lambda h: (*run_key(h), h["epoch"]))
            atomic_write_text(self.csv, _render(sorted(rows, key=_order), RESULT_FIELDS))
            history.sort(key=lambda h: (*_order(h), int(h["epoch"])))
            atomic_write_text(self.history, _render(history, HISTORY_FIELDS))


def _order(row: dict[str, str]) -> tuple:
    return tuple(_NUMERIC_KEY.get(name, str)(row[name]) for name in RUN_KEY)


def _unique(rows: list[dict[str, str]], key) -> list[dict[str, str]]:
    seen: dict[tuple, dict[str, str]] = {}
    for row in rows:
        seen.setdefault(key(row), row)
    return list(seen.values())


def _cell(value: object) -> str:
    """How a value is spelled in our CSVs: empty for None and NaN."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return ""
    return str(value)


def _render(rows: Iterable[dict[str, object]], fields: Sequence[str]) -> str:
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fields, lineterminator="\n")
    writer.writeheader()
    writer.writerows({name: _cell(row[name]) for name in fields} for row in rows)
    return buffer.getvalue()


def _read_rows(path: Path, fields: Sequence[str]) -> list[dict[str, str]]:
    """The complete rows of ``path`` (a trailing line cut short by a crash is dropped)."""
    if not path.exists():
        return []
    text = path.read_text(encoding="utf-8")
    if text and not text.endswith("\n"):
        text = text[: text.rfind("\n") + 1]
    reader = csv.DictReader(io.StringIO(text))
    if text and tuple(reader.fieldnames or ()) != tuple(fields):
        raise StabilityError(
            f"{path}: not a results file of this version; expected columns {', '.join(fields)}"
        )
    return list(reader)


def _append(path: Path, fields: Sequence[str], rows: list[dict[str, object]]) -> None:
    """Append ``rows`` to ``path`` in one write, then fsync."""
    text = path.read_text(encoding="utf-8") if path.exists() else ""
    if not text:
        prefix = _render([], fields)
    elif not text.endswith("\n"):  # a line cut short by a crash: drop it
        atomic_write_text(path, text[: text.rfind("\n") + 1])
        prefix = ""
    else:
        prefix = ""
    data = (prefix + _render(rows, fields).split("\n", 1)[1]).encode("utf-8")
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        while data:  # os.write may write less than asked
            data = data[os.write(fd, data) :]
        os.fsync(fd)
    finally:
        os.close(fd)


def _remove_stale_temps(folder: Path) -> None:
    """Temp files of writers killed mid-write (only ever removed under the folder lock)."""
    for stale in folder.glob(f".*{TEMP_SUFFIX}"):
        with contextlib.suppress(FileNotFoundError):
            stale.unlink()
