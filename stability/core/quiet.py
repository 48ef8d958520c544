"""Silencing TensorFlow's C++ log where it would only repeat what the harness says.

TensorFlow writes its start-up notices (oneDNN, CUDA probing) through absl before any log
level applies, so no environment variable hides them; they would bury the CLI's one-line
errors and every worker's output. A replay (``stability.train.replay``) ends in a
``check_numerics`` error that TensorFlow's C++ runtime also logs, some 70 lines, which
``TF_CPP_MIN_LOG_LEVEL`` hides only when set before TensorFlow loads, and TensorFlow has no
public call to change its C++ log level later; the replay turns that error into one line.
So both point file descriptor 2 away for the moment they run. Python-level errors surface
after stderr is restored.
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
