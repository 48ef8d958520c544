"""Silencing TensorFlow's C++ start-up notices while it loads.

TensorFlow writes its start-up notices (oneDNN, CUDA probing) through absl before any log
level applies, so no environment variable hides them; they would bury the CLI's one-line
errors and every worker's output. Python-level errors surface after stderr is restored.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator


@contextlib.contextmanager
def stderr_silenced() -> Iterator[None]:
    """Point file descriptor 2 at /dev/null for the duration of the block."""
    sys.stderr.flush()
    saved = os.dup(2)
    try:
        with open(os.devnull, "w") as devnull:
            os.dup2(devnull.fileno(), 2)
            yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)
