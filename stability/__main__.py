"""``python -m stability``."""

import os

from stability.core.quiet import stderr_silenced

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


with stderr_silenced():
    import keras  # noqa: F401
    import tensorflow as tf

    tf.constant(0.0)  # device start-up logs here, too

    import stability.sweep.runner  # noqa: F401

from stability.cli import main

raise SystemExit(main())
