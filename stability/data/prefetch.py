"""Building the next batches on a host thread while the current step runs.

A step of the seed's model takes a few milliseconds, and building a batch in numpy a few
tenths of one. TensorFlow releases the GIL while a compiled step runs, so one background
thread can build (and pad) the next batches in that time instead of after it, if a core is
free for it. On a machine whose cores the steps already fill (2 cores here, with TensorFlow's
intra-op threads or two workers on them) the thread competes with the step instead, which
is why the trainer leaves it off unless asked (``TrainConfig.prefetch``).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

T = TypeVar("T")

_END = object()


def prefetched(items: Iterable[T], depth: int) -> Iterator[T]:
    """Yield ``items`` in order while one thread produces up to ``depth`` ahead; with
    ``depth`` 0, produce each item when it is asked for, on the caller's thread.

    The items are produced one after another by that single thread, so a generator that
    draws from a random number generator draws exactly what it would draw unthreaded.
    An exception raised while producing an item is raised here, in its place.
    """
    if depth < 1:
        yield from items
        return
    source = iter(items)
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="stability-prefetch") as pool:
        pending = deque(pool.submit(next, source, _END) for _ in range(depth))
        while True:
            item = pending.popleft().result()
            if item is _END:
                return
            pending.append(pool.submit(next, source, _END))
            yield item
