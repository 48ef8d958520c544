"""Prefetching keeps the order, the random draws and the errors of what it prefetches."""

import numpy as np
import pytest

from stability.core.results import TIMING_FIELDS
from stability.data.prefetch import prefetched
from stability.model.variants import get_variant
from stability.train.config import TrainConfig
from stability.train.trainer import Trainer


@pytest.mark.parametrize("depth", [0, 1, 2, 5])
def test_items_come_in_order_with_the_same_random_draws(depth):
    def draws(rng):
        for _ in range(20):
            yield rng.normal()

    expected = list(draws(np.random.default_rng(0)))
    assert list(prefetched(draws(np.random.default_rng(0)), depth)) == expected


def test_an_error_while_producing_is_raised_in_its_place():
    def failing():
        yield 1
        raise ValueError("bad batch")

    items = prefetched(failing(), 2)
    assert next(items) == 1
    with pytest.raises(ValueError, match="bad batch"):
        next(items)


def test_a_run_with_prefetch_gives_the_rows_of_one_without(tiny_dataset):
    rows = []
    for prefetch in (0, 2):
        config = TrainConfig(seed=0, batch_size=16, epochs=2, hidden=8, prefetch=prefetch)
        result = Trainer(get_variant("raw_e"), tiny_dataset, config).run()
        rows.append({k: v for k, v in result.row().items() if k not in TIMING_FIELDS})
    assert rows[0] == rows[1]
