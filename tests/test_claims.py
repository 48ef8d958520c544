"""The verdict rules on synthetic rows: one set of rows per rule, each outcome checked."""

import math
import re
from pathlib import Path

import pandas as pd
import pytest

from stability.claims.report import summary
from stability.claims.rules import Rules, avoids, delays, hits, worse_mae
from stability.claims.stats import ClaimInputs, setting_stats
from stability.claims.table import (
    CLAIM_TABLE,
    CLAIMS,
    NOT_REPRODUCED,
    NOT_RUN,
    REPRODUCED,
    SEED_CLAIMS,
    judge,
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


#: The seed question and its answer, byte for byte as the project got them.
SEED_TEXT = Path(__file__).parent / "data" / "gradient-exploding-gnn.txt"


def test_every_claim_in_order_and_the_missing_cases_not_run():
    out = verdicts(seed_frame())
    assert list(out) == list(CLAIMS)
    assert {c.rstrip("ab") for c in out} == {f"C{i}" for i in range(1, 12)}
    for claim in ("C2a", "C2b", "C8a", "C8b"):
        assert out[claim].verdict == NOT_RUN, (claim, out[claim])
    for claim in SEED_CLAIMS:
        assert out[claim].verdict == REPRODUCED, (claim, out[claim])


def test_each_claim_is_declared_once():
    ids = [c.id for c in CLAIM_TABLE]
    assert len(set(ids)) == len(ids)
    assert list(CLAIMS) == ids and set(SEED_CLAIMS) < set(ids)


def test_the_seed_is_quoted_verbatim():
    seed = " ".join(SEED_TEXT.read_text(encoding="utf-8").split())
    for claim, quote in CLAIMS.items():
        for piece in re.findall(r'"(.*?)"(?:;|$)', quote):
            for part in piece.split(" [...] "):
                assert " ".join(part.split()) in seed, f"{claim}: {part!r} is not in the seed"


#: claim -> seed-case rows (overrides of ``seed_frame``) that make it fail, and a phrase
#: its "why not" must hold.
SEED_FAILURES = {
    "C1a": ({"raw_e": ([30, None, 34], 1.0)}, "stayed finite"),
    "C1b": ({"raw_e": ([70, 72, 74], 1.0)}, "later than the rule"),
    "C3": ({"no_e": ([None, 70, None], 2.0)}, "hit a NaN in 1/3"),
    "C4": ({"sigmoid_e": ([None] * 3, 1.02)}, "+2%"),
    "C5": ({"relu_e": ([None] * 3, 1.0)}, "stayed finite in all 3"),
    "C6": ({"grad_clip": ([None] * 3, 1.0)}, "stayed finite in all 3"),
    "C7": ({"sigma_clip": ([None] * 3, 1.0)}, "stayed finite in all 3"),
    "C9": ({"weight_constrained": ([None] * 3, 1.5)}, "+47%"),
    "C10": ({"stable_softmax": ([None, None, 90], 1.0)}, "hit a NaN in 1/3"),
}


@pytest.mark.parametrize("claim", list(SEED_FAILURES))
def test_each_seed_claim_both_ways(claim):
    assert verdicts(seed_frame())[claim].verdict == REPRODUCED
    overrides, phrase = SEED_FAILURES[claim]
    out = verdicts(seed_frame(**overrides))[claim]
    assert out.verdict == NOT_REPRODUCED, out
    assert phrase in out.why, out.why


def test_c1b_says_earlier_for_an_early_nan():
    out = verdicts(seed_frame(raw_e=([10, 12, 14], 1.0)))["C1b"]
    assert out.verdict == NOT_REPRODUCED and "earlier" in out.why
    assert "0.40 x the stated" in out.numbers


def test_a_fix_failing_before_raw_e_is_earlier_never_delayed():
    early = verdicts(seed_frame(sigmoid_e=([10, 11, 12], 1.5)))["C4"]
    assert "earlier" in early.why and "delayed" not in early.why
    late = verdicts(seed_frame(sigmoid_e=([90, 91, 92], 1.5)))["C4"]
    assert "delayed" in late.why and "earlier" not in late.why
    near = verdicts(seed_frame(grad_clip=([35, 36, 37], 1.0)))["C6"]
    assert "later, but by less" in near.numbers


def with_raw(**kwargs):
    return pd.concat(
        [seed_frame().query("variant != 'raw_e'"), rows("raw_e", [30, 32, 34], **kwargs)]
    )


def test_c11a_where_both_ways():
    out = verdicts(with_raw(where="gradient", op="Mul (gradient_tape/mul)"))
    assert out["C11a"].verdict == NOT_REPRODUCED
    assert "gradient stage" in out["C11a"].why
    assert out["C11b"].verdict == NOT_REPRODUCED


def test_c11b_mechanism_both_ways():
    exp = verdicts(with_raw(op="Exp (softmax_exp)"))
    assert exp["C11a"].verdict == REPRODUCED and exp["C11b"].verdict == REPRODUCED
    div = verdicts(with_raw(op="RealDiv (softmax_div)", logit=88.0))
    assert div["C11a"].verdict == REPRODUCED, "a softmax division is still the forward softmax"
    assert div["C11b"].verdict == NOT_REPRODUCED
    assert "0/0" in div["C11b"].why and "below the overflow line" in div["C11b"].why


def test_c11b_prints_the_limits_of_the_rows_dtype():
    frame = with_raw()
    frame["dtype"] = "float64"
    numbers = verdicts(frame)["C11b"].numbers
    assert "float64" in numbers and "+709.78" in numbers and "-708.40" in numbers


def batch_rows(at_256):
    return pd.concat(
        [
            rows("raw_e", [30, 32, 34], budget=200),
            rows("raw_e", [60, 62, 64], batch_size=128, budget=200),
            rows("raw_e", at_256, batch_size=256, budget=200),
        ]
    )


def test_c2_delays_and_avoids_apart():
    out = verdicts(seed_frame(), batch=batch_rows([90, 95, None]))
    assert out["C2a"].verdict == REPRODUCED and "per epoch: yes" in out["C2a"].numbers
    assert out["C2b"].verdict == REPRODUCED
    out = verdicts(seed_frame(), batch=batch_rows([None] * 3))
    assert out["C2a"].verdict == REPRODUCED, "a run without a NaN counts as later"
    assert out["C2b"].verdict == NOT_REPRODUCED and "batch 256" in out["C2b"].why
    out = verdicts(seed_frame(), batch=batch_rows([31, 33, 35]))
    assert out["C2a"].verdict == NOT_REPRODUCED and "did not delay" in out["C2a"].why


def lr_rows(at_low):
    return pd.concat(
        [RAW, rows("raw_e", [50, 52, 54], lr=1e-2 / 3), rows("raw_e", at_low, lr=1e-3)]
    )


def test_c8_delays_and_avoids_apart():
    out = verdicts(seed_frame(), lr=lr_rows([80, 85, 90]))
    assert out["C8a"].verdict == REPRODUCED and out["C8b"].verdict == REPRODUCED
    out = verdicts(seed_frame(), lr=lr_rows([None] * 3))
    assert out["C8a"].verdict == REPRODUCED
    assert out["C8b"].verdict == NOT_REPRODUCED and "lr 0.001" in out["C8b"].why
    out = verdicts(seed_frame(), lr=lr_rows([35, 33, 36]))
    assert out["C8a"].verdict == NOT_REPRODUCED, "1e-3 was not 1.5x later"


def summary_of(frame, **kw):
    inputs = ClaimInputs(seed=frame, batch_size=None, learning_rate=None, train_graphs=320, **kw)
    return summary(judge(inputs, RULES), inputs, RULES)


def test_the_summary_is_built_from_the_verdicts():
    forward = summary_of(seed_frame())
    assert "in the forward softmax and not in the gradients" in forward
    assert "exp overflowed" in forward and "C11b reproduced" in forward
    assert "stable_softmax had the lowest median final MAE" not in forward  # 1.02 vs 1.0
    assert "weight_constrained had the lowest median final MAE (1)" in forward
    gradient = summary_of(with_raw(where="gradient", op="Mul (gradient_tape/mul)"))
    assert "not in the gradients" not in gradient and "Since the NaN starts" not in gradient
    assert "Of the optimizer-side remedies" in gradient
    underflow = summary_of(with_raw(op="RealDiv (softmax_div)"))
    assert "0/0" in underflow and "C11b not reproduced" in underflow
    nothing = summary_of(
        seed_frame(
            **{
                v: ([1, 2, 3], 1.0)
                for v in ("no_e", "sigmoid_e", "weight_constrained", "stable_softmax")
            }
        )
    )
    assert "No variant avoided the NaN" in nothing


def test_a_divergence_without_a_nan_is_no_nan_to_the_rules():
    finite = rows("stable_softmax", [None, None, None], mae=0.2)
    diverged = finite.assign(
        diverged_epoch=[50, math.nan, math.nan],
        warning=["validation MAE diverged at epoch 50", None, None],
    )
    before, after = stats(finite, "stable_softmax"), stats(diverged, "stable_softmax")
    assert (after.nans, after.final_mae) == (before.nans, before.final_mae) == (0, 0.2)
    assert avoids(after, stats(RAW, "raw_e"), RULES) is avoids(before, stats(RAW, "raw_e"), RULES)
    assert "**NaN only**" in RULES.text() and "`diverged_epoch`" in RULES.text()
