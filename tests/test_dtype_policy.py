"""Each dtype policy: the naive softmax breaks at that dtype's exp limit, the stable one not."""

import numpy as np
import pytest

from stability import BuildContext
from stability.core.limits import exp_limits
from stability.model.recipe import Recipe, Variant
from stability.model.variants import create_recipe
from stability.train.config import DTYPES, TrainConfig, default_dtype
from stability.train.trainer import Trainer


def planted(softmax: str, max_logit: float):
    """Net's kernel zero except its weight on e, so that the largest logit (e < 4) is about
    ``max_logit``."""

    def build(ctx: BuildContext) -> Recipe:
        recipe = create_recipe(ctx, softmax=softmax)
        net = recipe.model.passes[0].net
        kernel = np.zeros(net.kernel.shape, "float32")
        kernel[-1] = max_logit / 4.0
        net.kernel.assign(kernel)
        return recipe

    return build


def first_step(dtype, softmax, max_logit, dataset):
    config = TrainConfig(seed=0, batch_size=16, epochs=1, hidden=8, dtype=dtype)
    return Trainer(
        Variant("planted", "test-only", planted(softmax, max_logit)), dataset, config
    ).run()


@pytest.mark.parametrize("dtype", DTYPES)
def test_naive_softmax_overflows_past_the_dtypes_limit_and_not_below(dtype, tiny_dataset):
    limit = exp_limits(dtype).overflow
    over = first_step(dtype, "naive", 1.3 * limit, tiny_dataset)
    assert over.first_nan_step == 1 and over.first_nan_op == "Exp (softmax_exp)", over
    under = first_step(dtype, "naive", 0.7 * limit, tiny_dataset)
    assert under.first_nan_step != 1, f"{dtype}: NaN below exp's limit {limit:.2f}"


@pytest.mark.parametrize("dtype", DTYPES)
def test_stable_softmax_stays_finite_past_the_limit(dtype, tiny_dataset):
    result = first_step(dtype, "stable", 1.3 * exp_limits(dtype).overflow, tiny_dataset)
    assert not result.hit_nan, (dtype, result.first_nan_where, result.first_nan_op)


def test_default_dtype_follows_the_environment(monkeypatch):
    monkeypatch.setenv("STABILITY_DTYPE", "float64")
    assert default_dtype() == "float64"
    assert TrainConfig().dtype == "float64"
    monkeypatch.setenv("STABILITY_DTYPE", "float8")
    with pytest.raises(ValueError, match="STABILITY_DTYPE='float8' must be one of"):
        default_dtype()
