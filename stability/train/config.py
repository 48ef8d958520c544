"""A run's settings: the dtype policy, ``TrainConfig`` and the seeding of a run."""

from __future__ import annotations

import os
from dataclasses import dataclass, field

import keras
import tensorflow as tf

from stability.core.errors import StabilityError
from stability.train.threads import LAYOUT

#: Dtype policies a run accepts: a float dtype, or Keras' mixed policy (float16 compute,
#: float32 weights), where the naive softmax's exp already overflows above 11.09.
DTYPES = ("float32", "float64", "mixed_float16")


def default_dtype() -> str:
    """The dtype policy of runs that do not name one: ``$STABILITY_DTYPE`` or float32.

    The tox matrix sets the variable to run the whole suite under each policy.
    """
    dtype = os.environ.get("STABILITY_DTYPE", "float32")
    if dtype not in DTYPES:
        raise StabilityError(f"STABILITY_DTYPE={dtype!r} must be one of {', '.join(DTYPES)}")
    return dtype


def storage_dtype(dtype: str) -> str:
    """The dtype of a batch's arrays and of the weights: float32 under a mixed policy."""
    return "float32" if dtype.startswith("mixed_") else dtype


@dataclass(frozen=True)
class TrainConfig:
    """The settings of one run. ``stop_at_nan=False`` trains on past the first NaN, the way
    an unguarded loop would, to see when (or whether) the loss itself turns non-finite."""

    case: str = "adhoc"
    seed: int = 0
    batch_size: int = 32
    learning_rate: float = 3e-2
    epochs: int = 100
    dtype: str = field(default_factory=default_dtype)
    hidden: int = 32
    num_layers: int = 1
    stop_at_nan: bool = True
    #: Compile the step with XLA; batches are then padded to one shape per run
    #: (``stability.data.padding``), since XLA compiles once per shape.
    jit_compile: bool = False
    #: How many batches a host thread builds ahead (``stability.data.prefetch``); 0 builds each
    #: batch when the step needs it. 0 by default: the thread needs a free core, and a
    #: sweep with --workers 2 on 2 cores leaves none (docs/performance.md, "Host-side prefetch").
    prefetch: int = 0
    #: Intra-op threads the run trains on (inter-op: 1). 1 by default, the layout of the
    #: committed reports: another count rounds the sums differently (``stability.train.threads``).
    threads: int = LAYOUT[0]


def seed_everything(seed: int) -> None:
    """Seed Python, NumPy and TensorFlow and make TensorFlow's ops deterministic.

    Without op determinism the same seed gave first NaNs epochs apart (DESIGN.md).
    """
    keras.utils.set_random_seed(seed)
    tf.config.experimental.enable_op_determinism()
