"""The one thread layout every run trains on: 1 intra-op and 1 inter-op thread.

TensorFlow's CPU kernels split a reduction (a matmul, a segment sum) into as many shards as
they have intra-op threads and add the shards' partial sums in that layout: with op
determinism on, a run is repeatable on one thread count, but another count rounds the sums
differently, and over thousands of Adam steps the trajectories part (measured: the seed
case's ``raw_e`` seed 0 fails at step 4008 on 1 thread and 4012 on 8). So the layout is a
setting of the run, 1 x 1 by default, in whichever process trains it: a serial sweep, a
worker, a Ray task, the pytest fixture, ``Trainer.run`` from Python.

TensorFlow sizes its pools once, when its context starts (its first op or device listing);
after that ``tf.config.threading`` refuses another size. ``pin`` sizes them while it still
can; a process whose TensorFlow already started with another layout cannot train a run
(``require`` says why in one line), and ``stability.sweep.runner`` then trains its runs in
a worker process instead. Sweeps keep their speed by training runs side by side
(``--workers``), not by threads inside one run.
"""

from __future__ import annotations

import os

from stability.core.errors import StabilityError

#: (intra-op, inter-op) threads a run trains on unless told otherwise.
LAYOUT = (1, 1)

#: TensorFlow's environment variables for the pools' sizes, read when its context starts
#: and only where ``tf.config.threading`` left a size at 0 ("TensorFlow's default").
_ENV = ("TF_NUM_INTRAOP_THREADS", "TF_NUM_INTEROP_THREADS")


def layout_name(layout: tuple[int | None, int | None]) -> str:
    """``1x1`` for 1 intra-op and 1 inter-op thread, as rows record it; ``default`` for a
    size left to TensorFlow (the machine's cores)."""
    return "x".join("default" if size is None else str(size) for size in layout)


def pin(intra: int = LAYOUT[0], inter: int = LAYOUT[1]) -> bool:
    """Size TensorFlow's pools to ``intra`` x ``inter`` threads if it has not started yet.

    True when the process now runs (or already ran) that layout; False when TensorFlow
    started with another one, which can no longer change in this process.
    """
    import tensorflow as tf

    try:
        tf.config.threading.set_intra_op_parallelism_threads(intra)
        tf.config.threading.set_inter_op_parallelism_threads(inter)
    except RuntimeError:  # the context started: sizes are fixed for the process's life
        return current() == (intra, inter)
    return True


def current() -> tuple[int | None, int | None]:
    """The (intra, inter) layout this process's TensorFlow runs or will run; None for a
    size left to TensorFlow's default (the machine's cores), which depends on the machine."""
    import tensorflow as tf

    sizes = (
        tf.config.threading.get_intra_op_parallelism_threads(),
        tf.config.threading.get_inter_op_parallelism_threads(),
    )
    intra, inter = (size or _from_environment(name) for size, name in zip(sizes, _ENV, strict=True))
    return intra, inter


def _from_environment(name: str) -> int | None:
    value = os.environ.get(name, "")
    return int(value) if value.isdigit() and int(value) > 0 else None


def require(intra: int = LAYOUT[0], inter: int = LAYOUT[1]) -> None:
    """Pin the layout, or fail in one line when this process cannot train on it."""
    if pin(intra, inter):
        return
    shown = layout_name(current())
    raise StabilityError(
        f"this process's TensorFlow already started on {shown} (intra x inter-op) threads, "
        f"and a run trains on {layout_name((intra, inter))}, so that its rows do not depend on "
        "the machine's cores; train it through stability.sweep.runner.run_case or the command "
        "line (they train in a worker process then), or call stability.pin_threads() before "
        "TensorFlow runs its first op"
    )


def can_train_here(intra: int = LAYOUT[0], inter: int = LAYOUT[1]) -> bool:
    """Whether runs of that layout can train in this process (pinning it if it can)."""
    return pin(intra, inter)


#: The public name (``stability.pin_threads``): call it before TensorFlow's first op to
#: train runs in this process on the fixed layout.
pin_threads = pin
