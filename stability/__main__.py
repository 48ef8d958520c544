"""``python -m stability``."""

import os

from stability.core.quiet import stderr_silenced
from stability.train.threads import pin

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


with stderr_silenced():
    import keras  # noqa: F401
    import tensorflow as tf

    # The fixed thread layout (stability.train.threads) before TensorFlow's first op below
    # starts its pools: the runs of a command then train in this process, not in a worker.
    pin()
    tf.constant(0.0)  # device start-up logs here, too

    import stability.sweep.runner  # noqa: F401

from stability.cli import main

raise SystemExit(main())
