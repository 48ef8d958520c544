"""A seeded draw from a Hypothesis strategy: the one module that uses Hypothesis internals.

Hypothesis has no public seeded draw outside ``@given`` (``.example()`` is unseeded and
meant for the REPL), and ``find()`` would shrink rather than draw. The ``generated`` data
set must be the same graphs for the same seed in every process, so this drives Hypothesis'
engine directly. Everything private it touches is named in ``PRIVATE_API`` and checked by
``tests/test_private_apis.py``, which fails loudly when a Hypothesis release moves it.
"""

from __future__ import annotations

import random
from typing import Any, TypeVar

from hypothesis import strategies as st
from hypothesis.control import BuildContext
from hypothesis.errors import StopTest
from hypothesis.internal.conjecture.data import ConjectureData
from hypothesis.internal.conjecture.providers import HypothesisProvider

from stability.core.errors import StabilityError

T = TypeVar("T")

#: The private names this module relies on (module, attribute); the test imports each.
PRIVATE_API = (
    ("hypothesis.internal.conjecture.data", "ConjectureData"),
    ("hypothesis.internal.conjecture.providers", "HypothesisProvider"),
    ("hypothesis.internal.conjecture.providers.HypothesisProvider", "_maybe_draw_constant"),
    ("hypothesis.control", "BuildContext"),
    ("hypothesis.errors", "StopTest"),
)


class _ReproducibleProvider(HypothesisProvider):
    """Hypothesis' own provider without its pool of "constants worth trying".

    That pool includes literals scraped from whichever user modules happen to be imported,
    and it is cached process-wide, so the same seed would draw differently under pytest and
    under the CLI. Without it a draw depends only on the seed and the strategy.
    """

    def _maybe_draw_constant(self, *args: Any, **kwargs: Any) -> None:
        return None


def draw(strategy: st.SearchStrategy[T], *, seed: int | str) -> T:
    """One value of ``strategy``, the same for the same ``seed`` (and Hypothesis version).

    Hypothesis has no public seeded draw outside ``@given`` (``.example()`` is unseeded and
    meant for the REPL), so this drives its engine directly with a seeded ``Random``.
    """
    data = ConjectureData(random=random.Random(seed), provider=_ReproducibleProvider)
    try:
        # Collection strategies look up the build context that @given would set up.
        with BuildContext(data, is_final=True, wrapped_test=draw):
            value = data.draw(strategy)
    except StopTest:
        raise StabilityError(
            f"cannot draw from {strategy!r} with seed {seed!r}: the value is too large; "
            "use smaller max_* arguments"
        ) from None
    data.freeze()
    return value
