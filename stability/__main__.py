"""``python -m stability``."""

import contextlib
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


@contextlib.contextmanager
def _stderr_silenced():
    """Silence file descriptor 2 while TensorFlow loads.

    Its C++ start-up notices (oneDNN, CUDA probing) are written by absl before any log
    level applies, so no environment variable hides them; they would bury the CLI's
    one-line errors. Python-level errors are raised after the descriptor is restored.
    """
    sys.stderr.flush()
    saved = os.dup(2)
    try:
        with open(os.devnull, "w") as devnull:
            os.dup2(devnull.fileno(), 2)
            yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)


with _stderr_silenced():
    import keras  # noqa: F401
    import tensorflow as tf

    tf.constant(0.0)  # device start-up logs here, too

    import stability.runner  # noqa: F401

from stability.cli import main  # noqa: E402

raise SystemExit(main())
