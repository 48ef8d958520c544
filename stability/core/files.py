"""Files written whole or not at all, and one writer at a time per output folder.

``atomic_writer`` writes a file to a temp file in the same folder, fsyncs it and renames it
over the target (``os.replace``), so readers see the old file or the new one, never a part.
Every report writer calls it. ``folder_lock`` is the lock (``.stability.lock``, a
``filelock.FileLock``) every writer into an output folder holds.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import IO

from filelock import FileLock

#: Suffix of the temp files ``atomic_writer`` leaves behind only if killed mid-write.
TEMP_SUFFIX = ".stability-tmp"
LOCK_NAME = ".stability.lock"


@contextlib.contextmanager
def atomic_writer(path: str | Path, mode: str = "w") -> Iterator[IO]:
    """Open a temp file beside ``path`` for writing (``mode`` "w" or "wb"); on success it
    is fsynced and renamed over ``path``, on error removed.

    ``with atomic_writer(p) as f: frame.to_csv(f)`` or ``fig.savefig(f, format="png")``
    with ``mode="wb"``.
    """
    path = Path(path)
    handle = tempfile.NamedTemporaryFile(  # noqa: SIM115 - closed by the with below
        mode,
        dir=path.parent,
        prefix=f".{path.name}.",
        suffix=TEMP_SUFFIX,
        delete=False,
        **({} if "b" in mode else {"encoding": "utf-8", "newline": ""}),
    )
    try:
        # mkstemp makes the file 0600; give it the mode a plain open() would have.
        os.chmod(handle.name, _file_mode(path))
        with handle:
            yield handle
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(handle.name, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(handle.name)
        raise
    _fsync_folder(path.parent)


def atomic_write_text(path: str | Path, text: str) -> None:
    """Replace ``path`` with ``text`` atomically."""
    with atomic_writer(path) as handle:
        handle.write(text)


def folder_lock(folder: Path) -> FileLock:
    """The lock every writer into ``folder`` holds (one per folder, across processes)."""
    return FileLock(folder / LOCK_NAME)


def _file_mode(path: Path) -> int:
    if path.exists():
        return path.stat().st_mode & 0o777
    umask = os.umask(0)
    os.umask(umask)
    return 0o666 & ~umask


def _fsync_folder(folder: Path) -> None:
    # The rename itself is durable only once the folder's entry is on disk.
    with contextlib.suppress(OSError):
        fd = os.open(folder, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
