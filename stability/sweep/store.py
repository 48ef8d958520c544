"""The run store: every finished run durable the moment it finishes, many writers at once.

- ``RunStore`` keeps the durable record of one case's sweep in ``<case>.runs.sqlite`` (SQLite
  from the standard library, WAL mode, the run key as primary key): ``add`` commits a run's
  result row and history rows in one transaction, O(1) whatever the store holds, so a run
  is on disk before the next result is taken, in whatever order runs finish. Sweeps in other
  processes may write into the same database at once; SQLite serialises their
  transactions, and a run already there is not written twice.
- ``<case>.csv`` and ``<case>.history.csv``, the files people review, are rendered from the
  database, atomically and in canonical order (sorted by ``RUN_KEY``): when a store opens,
  every ``RENDER_SECONDS`` or so while runs are added, and at ``finish``. A sweep killed
  between two renders has every finished run in the database, and ``--resume`` renders them.

One database per case, not per folder: a case's CSV, history and database travel together
(``tiny.*``), and sweeps of different cases into one folder never wait for each other's
write lock. Renders and opening a store hold the folder's lock (``.stability.lock``).
"""

from __future__ import annotations

import contextlib
import csv
import io
import sqlite3
import time
from collections.abc import Iterable, Sequence
from pathlib import Path

from stability.core.errors import StabilityError
from stability.core.files import TEMP_SUFFIX, atomic_writer, folder_lock
from stability.core.results import HISTORY_FIELDS, RESULT_FIELDS, RunResult, cell

#: The columns that name one run: a case also sweeps batch sizes and learning rates, so
#: they belong to the key beside case, variant, seed and data set.
RUN_KEY = ("case", "variant", "seed", "dataset", "batch_size", "learning_rate")

#: The least time between two renders of the CSVs while runs are added; a render that
#: takes long (a huge store) is spaced further (``RENDER_SHARE``).
RENDER_SECONDS = 5.0
#: A render waits at least this many times its own duration since the last one, so that
#: rendering costs at most about 1/20 of the time, however many rows the store holds.
RENDER_SHARE = 20.0

#: How long a writer waits for another process's transaction before giving up.
BUSY_SECONDS = 120.0

#: The database file of a case, beside its CSVs.
DB_SUFFIX = ".runs.sqlite"

_NUMERIC_KEY = {"seed": int, "batch_size": int, "learning_rate": float, "epoch": int}
_SQL_TYPES = {int: "INTEGER", float: "REAL"}


def run_key(row: dict[str, object]) -> tuple[str, ...]:
    """The key of a result row, as the CSV spells it."""
    return tuple(_cell(row[name]) for name in RUN_KEY)


def store_path(out_dir: Path, case: str) -> Path:
    """The database file of ``case`` in ``out_dir``."""
    return Path(out_dir) / f"{case}{DB_SUFFIX}"


class RunStore:
    """The durable runs of one case in ``out_dir`` and the CSVs rendered from them.

    Without ``resume``, a store (or a CSV without one) that already holds rows is an error
    (nothing is silently overwritten); with it, the runs already there are skipped
    (``done``); ``overwrite`` starts afresh, deliberately discarding their rows. ``settings``
    (columns outside ``RUN_KEY``, such as epochs and dtype) must match the rows resumed. A
    CSV written before the database existed is taken into it on ``resume``.
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
        self.case = case
        self.csv = self.out_dir / f"{case}.csv"
        self.history = self.out_dir / f"{case}.history.csv"
        self.path = store_path(self.out_dir, case)
        self._last_render = 0.0
        self._render_cost = 0.0
        try:
            self.out_dir.mkdir(parents=True, exist_ok=True)
            with folder_lock(self.out_dir):
                _remove_stale_temps(self.out_dir)
                created = not self.path.exists()
                self._db: sqlite3.Connection | None = None
                try:
                    self._db = _connect(self.path)
                    self._open(resume, overwrite, settings or {})
                    self.done: set[tuple[str, ...]] = set(self._keys())
                    self._render()
                except BaseException:
                    if self._db is not None:
                        self._db.close()
                    if created:  # refused or failed: leave no database behind
                        _remove_database(self.path)
                    raise
        except (OSError, sqlite3.Error) as exc:
            raise StabilityError(f"{self.out_dir}: cannot write results ({exc})") from None

    def _open(self, resume: bool, overwrite: bool, settings: dict[str, object]) -> None:
        if overwrite:
            with _transaction(self._db):
                self._db.execute("DELETE FROM results")
                self._db.execute("DELETE FROM history")
            return
        held = self._count()
        legacy = [] if held else _read_rows(self.csv, RESULT_FIELDS)
        if (held or legacy) and not resume:
            raise StabilityError(
                f"{self.csv} already holds {held or len(legacy)} run(s); pass --resume to keep "
                "them and run only the missing ones, --overwrite to discard them, or another --out"
            )
        if legacy:
            self._take_legacy(legacy)
        for name, value in settings.items():
            other = {
                cell for (cell,) in self._db.execute(f"SELECT DISTINCT {_q(name)} FROM results")
            } - {_cell(value)}
            if other:
                raise StabilityError(
                    f"{self.csv} holds runs with {name} = {sorted(other)[0]}, this case has "
                    f"{name} = {value}; --resume cannot mix them, choose another --out"
                )

    def _take_legacy(self, rows: list[dict[str, str]]) -> None:
        """Rows of a CSV written before the database (an older version, or the database
        deleted): they and their history become the store's."""
        history = _read_rows(self.history, HISTORY_FIELDS)
        with _transaction(self._db):
            _insert(self._db, "results", RESULT_FIELDS, rows)
            keys = {run_key(r) for r in rows}
            _insert(self._db, "history", HISTORY_FIELDS, [h for h in history if run_key(h) in keys])

    def add(self, result: RunResult) -> None:
        """Commit ``result``'s row and history in one transaction, durably; a run another
        process finished meanwhile is not written twice. Renders the CSVs when due."""
        row = result.row()
        try:
            with _transaction(self._db):
                if _insert(self._db, "results", RESULT_FIELDS, [row]):
                    _insert(self._db, "history", HISTORY_FIELDS, result.history_rows())
        except sqlite3.Error as exc:
            raise StabilityError(f"{self.path}: cannot write results ({exc})") from None
        self.done.add(run_key(row))
        due = max(RENDER_SECONDS, RENDER_SHARE * self._render_cost)
        if time.monotonic() - self._last_render >= due:
            with folder_lock(self.out_dir):
                self._render()

    def rows(self) -> list[dict[str, str]]:
        """Every result row in the store (this process's and others'), spelled as the CSV
        spells them, in the CSV's order."""
        cursor = self._db.execute(
            f"SELECT {', '.join(map(_q, RESULT_FIELDS))} FROM results ORDER BY {_order(RUN_KEY)}"
        )
        return [dict(zip(RESULT_FIELDS, row, strict=True)) for row in cursor]

    def histories(self) -> dict[tuple[str, ...], list[dict[str, str]]]:
        """Every history row in the store, spelled as the CSV spells them, by run key, each
        run's epochs in order."""
        cursor = self._db.execute(
            f"SELECT {', '.join(map(_q, HISTORY_FIELDS))} FROM history "
            f"ORDER BY {_order((*RUN_KEY, 'epoch'))}"
        )
        runs: dict[tuple[str, ...], list[dict[str, str]]] = {}
        for values in cursor:
            row = dict(zip(HISTORY_FIELDS, values, strict=True))
            runs.setdefault(run_key(row), []).append(row)
        return runs

    def rewrite(self, rows: Sequence[dict[str, object]]) -> None:
        """Replace the result rows of runs the store holds by ``rows`` (keyed by ``RUN_KEY``)
        in one transaction, then render the CSVs: a run's summary recomputed from its
        history (``report --resummarize``) lands in the store and the CSV at once. A row
        whose run the store does not hold is an error, and nothing is written."""
        others = [name for name in RESULT_FIELDS if name not in RUN_KEY]
        assign = ", ".join(f"{_q(name)} = ?" for name in others)
        where = " AND ".join(f"{_q(name)} = ?" for name in RUN_KEY)
        try:
            with _transaction(self._db):
                for row in rows:
                    values = [_cell(row[name]) for name in (*others, *RUN_KEY)]
                    cursor = self._db.execute(f"UPDATE results SET {assign} WHERE {where}", values)
                    if cursor.rowcount != 1:
                        raise StabilityError(f"{self.path}: holds no run {run_key(row)}")
        except sqlite3.Error as exc:
            raise StabilityError(f"{self.path}: cannot write results ({exc})") from None
        with folder_lock(self.out_dir):
            self._render()

    def finish(self) -> None:
        """Render both CSVs from every run in the store (this process's and others'), then
        close the database."""
        try:
            with folder_lock(self.out_dir):
                self._render()
        finally:
            self.close()

    def close(self) -> None:
        """Close the database (the last connection to close folds the WAL file back in)."""
        self._db.close()

    def _count(self) -> int:
        return self._db.execute("SELECT COUNT(*) FROM results").fetchone()[0]

    def _keys(self) -> Iterable[tuple[str, ...]]:
        return self._db.execute(f"SELECT {', '.join(map(_q, RUN_KEY))} FROM results")

    def _render(self) -> None:
        """Write both CSVs from the database, atomically, sorted by ``RUN_KEY`` (history by
        epoch within a run), streaming rows so that memory does not grow with the store.
        Callers hold the folder lock, so a render never overwrites a later one with older
        rows."""
        started = time.monotonic()
        _render_table(self._db, "results", RESULT_FIELDS, RUN_KEY, self.csv)
        _render_table(self._db, "history", HISTORY_FIELDS, (*RUN_KEY, "epoch"), self.history)
        self._last_render = time.monotonic()
        self._render_cost = self._last_render - started


def _q(name: str) -> str:
    """A column name quoted for SQL (``case`` is a keyword)."""
    return '"' + name.replace('"', '""') + '"'


def _connect(path: Path) -> sqlite3.Connection:
    """Open (creating if need be) the store at ``path`` in WAL mode, its schema checked."""
    db = sqlite3.connect(path, timeout=BUSY_SECONDS, isolation_level=None)
    try:
        # WAL: readers never block the writer, and a commit appends to one file.
        # synchronous=FULL: a commit is fsynced, so a run is durable once add returns
        # (NORMAL would survive a kill but could lose the last commits on power loss).
        db.execute("PRAGMA journal_mode=WAL")
        db.execute("PRAGMA synchronous=FULL")
        with _transaction(db):
            for table, fields, key in (
                ("results", RESULT_FIELDS, RUN_KEY),
                ("history", HISTORY_FIELDS, (*RUN_KEY, "epoch")),
            ):
                columns = ", ".join(f"{_q(n)} TEXT NOT NULL" for n in fields)
                primary = ", ".join(map(_q, key))
                db.execute(
                    f"CREATE TABLE IF NOT EXISTS {table} ({columns}, PRIMARY KEY ({primary}))"
                )
                found = tuple(r[1] for r in db.execute(f"PRAGMA table_info({table})"))
                if found == tuple(fields[: len(found)]):
                    # A store of an older version: columns are only ever appended, so
                    # its rows gain the new ones, empty (as an old CSV is read).
                    for name in fields[len(found) :]:
                        db.execute(
                            f"ALTER TABLE {table} ADD COLUMN {_q(name)} TEXT NOT NULL DEFAULT ''"
                        )
                    found = tuple(fields)
                if found != tuple(fields):
                    raise StabilityError(
                        f"{path}: not a run store of this version; its {table} table has "
                        f"columns {', '.join(found)}, expected {', '.join(fields)}"
                    )
    except BaseException:
        db.close()
        raise
    return db


@contextlib.contextmanager
def _transaction(db: sqlite3.Connection):
    # IMMEDIATE takes the write lock at the start: two writers never both read, then both
    # try to upgrade (which would fail one of them with "database is locked").
    db.execute("BEGIN IMMEDIATE")
    try:
        yield
    except BaseException:
        db.execute("ROLLBACK")
        raise
    db.execute("COMMIT")


def _insert(
    db: sqlite3.Connection, table: str, fields: Sequence[str], rows: Sequence[dict[str, object]]
) -> int:
    """Insert ``rows`` spelled as the CSV spells them; rows whose key is there already are
    kept as they are. Returns how many rows were new."""
    marks = ", ".join("?" for _ in fields)
    before = db.total_changes
    db.executemany(
        f"INSERT OR IGNORE INTO {table} VALUES ({marks})",
        ([_cell(row[name]) for name in fields] for row in rows),
    )
    return db.total_changes - before


def _render_table(
    db: sqlite3.Connection, table: str, fields: Sequence[str], key: Sequence[str], path: Path
) -> None:
    """Replace ``path`` with ``table`` as CSV, rows sorted by ``key`` (numbers as numbers;
    text by code point, as Python sorts it: SQLite compares TEXT as UTF-8 bytes)."""
    cursor = db.execute(f"SELECT {', '.join(map(_q, fields))} FROM {table} ORDER BY {_order(key)}")
    with atomic_writer(path) as handle:
        writer = csv.writer(handle, lineterminator="\n")
        writer.writerow(fields)
        writer.writerows(cursor)


def _order(key: Sequence[str]) -> str:
    """An ORDER BY clause for ``key``: numbers as numbers, text as text."""
    return ", ".join(
        f"CAST({_q(n)} AS {_SQL_TYPES[_NUMERIC_KEY[n]]})" if n in _NUMERIC_KEY else _q(n)
        for n in key
    )


#: How a value is spelled in our CSVs (``stability.core.results.cell``).
_cell = cell


def _read_rows(path: Path, fields: Sequence[str]) -> list[dict[str, str]]:
    """The complete rows of ``path`` (a trailing line cut short by a crash is dropped)."""
    if not path.exists():
        return []
    text = path.read_text(encoding="utf-8")
    if text and not text.endswith("\n"):
        text = text[: text.rfind("\n") + 1]
    reader = csv.DictReader(io.StringIO(text))
    found = tuple(reader.fieldnames or ())
    # A CSV of an older version: columns are only ever appended, so its rows gain the new
    # ones, empty (as an old store's table does in ``_connect``).
    if text and found != tuple(fields[: len(found)]):
        raise StabilityError(
            f"{path}: not a results file of this version; expected columns {', '.join(fields)}"
        )
    return [{name: row.get(name, "") for name in fields} for row in reader]


def _remove_database(path: Path) -> None:
    for name in (path.name, f"{path.name}-wal", f"{path.name}-shm"):
        with contextlib.suppress(FileNotFoundError):
            (path.parent / name).unlink()


def _remove_stale_temps(folder: Path) -> None:
    """Temp files of writers killed mid-write (only ever removed under the folder lock)."""
    for stale in folder.glob(f".*{TEMP_SUFFIX}"):
        with contextlib.suppress(FileNotFoundError):
            stale.unlink()
