"""Starting TensorFlow for a command, quietly and on the fixed thread layout.

Only once the command line has parsed: ``--help``, ``--version`` and a flag argparse
refuses answer without loading TensorFlow, which takes seconds. Every command then starts
it here, before a plugin or a case could run its first op.
"""

from __future__ import annotations

import os
import sys


def start_tensorflow() -> None:
    """Load TensorFlow with its C++ start-up notices hidden and its thread pools pinned
    (``stability.train.threads``); nothing when this process already loaded it, as a test
    that calls ``stability.cli.main`` has, in the layout it chose."""
    if "tensorflow" in sys.modules:
        return
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    from stability.core.quiet import stderr_silenced

    with stderr_silenced():
        import keras  # noqa: F401
        import tensorflow as tf

        from stability.train.threads import pin

        # The fixed thread layout before TensorFlow's first op below starts its pools: the
        # runs of a command then train in this process, not in a worker.
        pin()
        tf.constant(0.0)  # device start-up logs here, too

        import stability.sweep.runner  # noqa: F401
