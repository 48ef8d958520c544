"""The verdict rules on synthetic rows: one set of rows per rule, each outcome checked."""

import math

import pandas as pd
import pytest

from stability.report.claims import (
    NOT_REPRODUCED,
    NOT_RUN,
    REPRODUCED,
    ClaimInputs,
    Rules,
    avoids,
    delays,
    hits,
    judge,
    setting_stats,
    worse_mae,
)

RULES = Rules()
SPE = 10  # steps per epoch in these rows


def rows(
    variant,
    nan_epochs,
    budget=100,
    mae=1.0,
    batch_size=32,
    lr=1e-2,
    where="forward",
    op="Exp (softmax_exp)",
    logit=50.0,
):
    """One row per run; ``None`` in ``nan_epochs`` is a run that stayed finite."""
    out = []
    for seed, epoch in enumerate(nan_epochs):
        nan = epoch is not None
        out.append(
            {
                "variant": variant,
                "seed": seed,
                "batch_size": batch_size,
                "learning_rate": lr,
                "epochs": budget,
                "first_nan_epoch": epoch if nan else math.nan,
                "first_nan_step": (epoch - 1) * (320 // batch_size) + 1 if nan else math.nan,
                "first_nan_where": where if nan else None,
                "first_nan_op": op if nan else None,
                "final_mae": math.nan if nan else mae,
                "max_abs_logit": logit,
            }
        )
    return pd.DataFrame(out)


def stats(frame, variant, batch_size=None, lr=None):
    return setting_stats(frame, variant, SPE, batch_size, lr)


RAW = rows("raw_e", [30, 32, 34])


@pytest.mark.parametrize(
    ("epochs", "budget", "expected"),
    [
        pytest.param([None, None, None], 100, True, id="finite-long-budget"),
        pytest.param([None, None, None], 90, None, id="budget-under-3x"),
        pytest.param([None, 80, None], 100, False, id="one-nan"),
    ],
)
def test_avoids(epochs, budget, expected):
    frame = pd.concat([RAW, rows("fix", epochs, budget=budget)])
    assert avoids(stats(frame, "fix"), stats(frame, "raw_e"), RULES) is expected


def test_avoids_needs_a_reference_that_fails():
    frame = pd.concat([rows("raw_e", [None] * 3), rows("fix", [None] * 3)])
    assert avoids(stats(frame, "fix"), stats(frame, "raw_e"), RULES) is None


@pytest.mark.parametrize(
    ("epochs", "budget", "expected"),
    [
        pytest.param([48, 50, 60], 100, True, id="1.5x-later"),
        pytest.param([40, 44, 46], 100, False, id="not-enough"),
        pytest.param([None, None, 40], 100, True, id="censored-past-budget"),
        pytest.param([None, None, 40], 40, None, id="censored-budget-too-short"),
    ],
)
def test_delays_per_epoch(epochs, budget, expected):
    frame = pd.concat([RAW, rows("late", epochs, budget=budget)])
    assert delays(stats(frame, "late"), stats(frame, "raw_e"), RULES, "epoch") is expected


def test_delay_per_epoch_need_not_be_a_delay_per_step():
    """Batch 128 has 4x fewer steps per epoch: 2x the epochs is half the steps."""
    frame = pd.concat([RAW, rows("raw_e", [62, 64, 66], batch_size=128)])
    base = setting_stats(frame, "raw_e", 10, batch_size=32)
    large = setting_stats(frame, "raw_e", 2, batch_size=128)
    assert delays(large, base, RULES, "epoch") is True
    assert delays(large, base, RULES, "step") is False


@pytest.mark.parametrize(("mae", "expected"), [(1.2, True), (1.05, False)])
def test_worse_mae(mae, expected):
    frame = rows("fix", [None] * 3, mae=mae)
    assert worse_mae(stats(frame, "fix"), 1.0, RULES) is expected


def test_hits_needs_every_run():
    assert hits(stats(RAW, "raw_e"))
    assert not hits(stats(rows("raw_e", [30, None, 34]), "raw_e"))


def test_input_nan_is_not_a_training_nan():
    frame = rows("raw_e", [5, 5, 5], where="input")
    assert stats(frame, "raw_e").nans == 0


def seed_frame(**overrides):
    """A seed case where every claim comes out as the seed tells it, unless overridden."""
    spec = {
        "raw_e": ([30, 32, 34], 1.0),
        "no_e": ([None] * 3, 2.0),
        "sigmoid_e": ([None] * 3, 1.5),
        "relu_e": ([30, 32, 34], 1.0),
        "grad_clip": ([40, 42, 44], 1.0),
        "sigma_clip": ([31, 33, 35], 1.0),
        "weight_constrained": ([None] * 3, 1.0),
        "stable_softmax": ([None] * 3, 1.02),
    }
    spec.update(overrides)
    return pd.concat([rows(v, e, mae=m) for v, (e, m) in spec.items()])


def verdicts(seed, batch=None, lr=None):
    inputs = ClaimInputs(seed=seed, batch_size=batch, learning_rate=lr, train_graphs=320)
    return {v.id: v for v in judge(inputs, RULES)}


def test_all_eleven_claims_in_order_and_the_missing_cases_not_run():
    out = verdicts(seed_frame())
    assert list(out) == [f"C{i}" for i in range(1, 12)]
    assert out["C2"].verdict == NOT_RUN and out["C8"].verdict == NOT_RUN
    for claim in ("C1", "C3", "C4", "C5", "C6", "C7", "C9", "C10", "C11"):
        assert out[claim].verdict == REPRODUCED, (claim, out[claim])


def test_each_seed_claim_can_fail():
    out = verdicts(
        seed_frame(
            no_e=([None, 70, None], 2.0),  # C3: one NaN
            sigmoid_e=([None] * 3, 1.02),  # C4: no MAE cost
            relu_e=([None] * 3, 1.0),  # C5: relu avoided it
            weight_constrained=([None] * 3, 1.5),  # C9: MAE cost
        )
    )
    for claim in ("C3", "C4", "C5", "C9"):
        assert out[claim].verdict == NOT_REPRODUCED, (claim, out[claim])
        assert out[claim].why, f"{claim} needs a one-sentence explanation"


def test_c1_needs_every_raw_e_run_to_fail():
    out = verdicts(seed_frame(raw_e=([30, None, 34], 1.0)))
    assert out["C1"].verdict == NOT_REPRODUCED
    assert "stayed finite" in out["C1"].why


def test_c11_needs_the_softmax_exp_in_the_forward_pass():
    division = rows("raw_e", [30, 32, 34], op="RealDiv (softmax_div)")
    frame = pd.concat([seed_frame().query("variant != 'raw_e'"), division])
    out = verdicts(frame)
    assert out["C11"].verdict == NOT_REPRODUCED
    assert "RealDiv" in out["C11"].why


def test_batch_and_learning_rate_claims():
    batch = pd.concat(
        [
            RAW,
            rows("raw_e", [60, 62, None], batch_size=128, budget=200),
            rows("raw_e", [None] * 3, batch_size=256, budget=200),
        ]
    )
    lr = pd.concat(
        [RAW, rows("raw_e", [50, 52, 54], lr=1e-2 / 3), rows("raw_e", [35, 33, 36], lr=1e-3)]
    )
    out = verdicts(seed_frame(), batch, lr)
    assert out["C2"].verdict == REPRODUCED
    assert "per epoch: yes" in out["C2"].numbers
    assert out["C8"].verdict == NOT_REPRODUCED, "1e-3 was not 1.5x later"
