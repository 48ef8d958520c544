"""A pool of worker processes that trains the runs of a sweep in parallel.

Runs are independent (each seeds everything and builds its own model), so N processes train
N runs at once. Every worker is a fresh ``spawn``-ed interpreter: a forked child would
inherit TensorFlow's already-started thread pools, and the pools' sizes can only be set
before TensorFlow runs its first op. Each worker trains on the runs' thread layout
(``stability.train.threads``: 1 intra-op and 1 inter-op thread unless measuring another),
whatever the number of workers or cores, so that the rows do not depend on either; on N
cores, N workers keep every core busy.

Each result goes to the store the moment its run finishes (``as_completed``), so a kill
loses no finished run, whichever run finished first; the list returned is in the order of
the configs given, so a parallel sweep returns (and its store renders) the rows of a serial
one in the same order.

With or without XLA, the thread count moves the numbers: XLA splits its loops by it
(``tests/test_xla_threads.py`` shows a first-NaN step that moves with it), and TensorFlow's
own kernels shard their sums by it, deterministic ops or not (``tests/test_thread_layout.py``).
"""

from __future__ import annotations

import contextlib
import importlib
import multiprocessing
import os
import sys
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from concurrent.futures.process import BrokenProcessPool
from typing import TYPE_CHECKING

from tqdm.auto import tqdm

from stability.core.errors import StabilityError
from stability.core.quiet import stderr_silenced
from stability.core.results import RunResult
from stability.data import Dataset

if TYPE_CHECKING:
    # Not at run time: a spawned worker imports this module before start_worker can
    # silence TensorFlow's start-up notices, and the trainer imports TensorFlow.
    from stability.train.config import TrainConfig

#: (data set, variant name, config) of one run, as ``runner.run_case`` lists them.
RunConfig = tuple[Dataset, str, "TrainConfig"]


def variant_modules(names: Sequence[str]) -> list[str]:
    """The modules that register ``names``; a worker imports them to see the same registry.

    A variant registered in ``__main__`` (a script) cannot be imported by a spawned worker.
    """
    from stability.model.variants import get_variant

    modules = []
    for name in dict.fromkeys(names):
        module = get_variant(name).build.__module__
        if module == "__main__":
            raise StabilityError(
                f"variant {name!r} is registered in a script (__main__); --workers needs it "
                "in an importable module passed with --plugin"
            )
        modules.append(module)
    return sorted(set(modules))


def start_worker(intra: int, inter: int, modules: list[str], path: list[str]) -> None:
    """Size TensorFlow's thread pools before anything runs, then load the variants."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    sys.path[:] = path  # so that a user's --plugin module beside the case imports here too
    with stderr_silenced():  # as in __main__: TensorFlow's C++ start-up notices
        import tensorflow as tf

        from stability.train.threads import require

        require(intra, inter)
        tf.constant(0.0)  # start the device (and its CUDA probing) while stderr is silenced
    for module in modules:
        importlib.import_module(module)


def train_run(dataset: Dataset, variant: str, config: TrainConfig) -> RunResult:
    """Train one run (in a worker process or a Ray task)."""
    from stability.model.variants import get_variant
    from stability.train.trainer import Trainer

    return Trainer(get_variant(variant), dataset, config).run()


class Progress:
    """The progress bar of a parallel sweep: finished/total runs, and how many of them
    failed so far (hit a non-finite value: the failures a stability test is after)."""

    def __init__(self, total: int, desc: str, enabled: bool):
        self.enabled = enabled
        self.failed = 0
        self.bar = tqdm(total=total, desc=desc, unit="run", disable=not enabled)
        self.bar.set_postfix(failed=0)

    def update(self, result: RunResult) -> None:
        self.failed += result.hit_nan
        if self.enabled:
            self.bar.write(result.summary_line())
        self.bar.set_postfix(failed=self.failed, refresh=False)
        self.bar.update(1)

    def close(self) -> None:
        self.bar.close()


def in_serial_order(finished: dict[int, RunResult], total: int) -> list[RunResult]:
    """The results of runs ``0 .. total - 1``, given by index in any order (a run left out
    by ``on_error`` has none)."""
    return [finished[index] for index in range(total) if index in finished]


def run_in_workers(
    configs: Sequence[RunConfig],
    workers: int,
    progress: bool = True,
    on_result: Callable[[RunResult], None] | None = None,
    desc: str = "runs",
    intra_threads: int = 1,
    on_error: Callable[[int, Exception], None] | None = None,
) -> list[RunResult]:
    """Train every run of ``configs`` in ``workers`` processes of ``intra_threads`` x 1
    threads (the runs' layout, ``TrainConfig.threads``).

    ``on_result`` sees each result as soon as its run finishes, in the order they finish;
    the list returned is in the order of ``configs``. A run that raises ends the sweep,
    unless ``on_error(index, error)`` takes it: then the run is left out and the rest go on
    (the doctor's remedies: a remedied variant that cannot train is not applicable).
    """
    if workers < 1:
        raise StabilityError(f"--workers {workers} must be at least 1")
    intra, inter = intra_threads, 1
    modules = variant_modules([variant for _, variant, _ in configs])
    finished: dict[int, RunResult] = {}
    bar = Progress(len(configs), desc, progress)
    with _pool(workers, intra, inter, modules) as pool:
        # Each task carries its data set: a few MB pickled, against seconds of training.
        futures = {pool.submit(train_run, *run): index for index, run in enumerate(configs)}
        try:
            for future in as_completed(futures):
                try:
                    result = future.result()
                except Exception as exc:
                    if isinstance(exc, BrokenProcessPool):
                        pool.broken = True  # a worker died: the pool takes no more runs
                    if on_error is None:
                        raise
                    on_error(futures[future], exc)
                    continue
                finished[futures[future]] = result
                if on_result is not None:
                    on_result(result)
                bar.update(result)
        except BaseException:
            for future in futures:
                future.cancel()
            raise
        finally:
            bar.close()
    return in_serial_order(finished, len(configs))


class _Pool(ProcessPoolExecutor):
    """A process pool that knows whether a worker died under it (then it takes no runs)."""

    broken = False


#: The pools kept for the next sweep inside ``kept_pools``, by (workers, threads, modules).
_KEPT: dict[tuple, _Pool] | None = None


@contextlib.contextmanager
def kept_pools() -> Iterator[None]:
    """Inside the block, a sweep's worker processes stay up for the next sweep of the same
    workers, threads and variant modules (a doctor's stages: each would start its workers
    again, TensorFlow's import and all); they stop when the block ends. A worker keeps
    nothing from one run to the next that a run reads: each seeds everything and builds
    its own model."""
    global _KEPT
    if _KEPT is not None:  # nested: the outer block keeps them
        yield
        return
    _KEPT = {}
    try:
        yield
    finally:
        kept, _KEPT = _KEPT, None
        for pool in kept.values():
            pool.shutdown(cancel_futures=True)


@contextlib.contextmanager
def _pool(workers: int, intra: int, inter: int, modules: list[str]) -> Iterator[_Pool]:
    """A pool of ``workers`` spawned processes on ``intra`` x ``inter`` threads that import
    ``modules``: kept for the next sweep inside ``kept_pools`` (dropped when a sweep
    fails), else stopped after this one."""
    key = (workers, intra, inter, tuple(modules), tuple(sys.path))
    pool = (_KEPT or {}).get(key) or _Pool(
        max_workers=workers,
        mp_context=multiprocessing.get_context("spawn"),
        initializer=start_worker,
        initargs=(intra, inter, modules, list(sys.path)),
    )
    if _KEPT is None:
        with pool:
            yield pool
        return
    for other in [k for k in _KEPT if k != key]:  # one pool kept at most: each holds memory
        _KEPT.pop(other).shutdown(cancel_futures=True)
    _KEPT.pop(key, None)  # out while in use: a failed sweep does not give it back
    try:
        yield pool
    except BaseException:
        pool.shutdown(cancel_futures=True)
        raise
    if pool.broken:
        pool.shutdown(cancel_futures=True)
    else:
        _KEPT[key] = pool
