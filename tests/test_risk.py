"""Risk lines: the logit trend and where it crosses exp's limit, on synthetic histories."""

import math

import numpy as np
import pandas as pd
import pytest

from stability.core.limits import exp_limits
from stability.report.risk import (
    MIN_TREND_EPOCHS,
    crossing_epoch,
    logit_trend,
    risk_table,
    run_risks,
)

LINE = exp_limits("float32").underflow


def test_trend_recovers_a_straight_line_from_the_second_half():
    epochs = np.arange(1, 41)
    # A fast start the fit should ignore, then growth of 0.5 per epoch.
    logits = np.where(epochs <= 20, 3.0 * epochs, 60 + 0.5 * (epochs - 20))
    slope, intercept = logit_trend(epochs, logits)
    assert slope == pytest.approx(0.5) and intercept == pytest.approx(50.0)
    assert crossing_epoch(slope, intercept, LINE) == pytest.approx((LINE - 50) / 0.5)


def test_no_growth_never_crosses():
    assert crossing_epoch(0.0, 1.0, LINE) == math.inf
    assert math.isnan(logit_trend(np.array([1]), np.array([1.0]))[0])


def _case(slopes: dict[str, float], nan: dict[str, int], budget: int = 50):
    results, history = [], []
    for variant, slope in slopes.items():
        last = nan.get(variant, budget)
        results.append(
            {
                "variant": variant,
                "seed": 0,
                "dataset": "d",
                "batch_size": 32,
                "learning_rate": 0.01,
                "epochs": budget,
                "dtype": "float32",
                "first_nan_epoch": nan.get(variant),
            }
        )
        for epoch in range(1, last + 1):
            history.append(
                {
                    "variant": variant,
                    "seed": 0,
                    "dataset": "d",
                    "batch_size": 32,
                    "learning_rate": 0.01,
                    "epoch": epoch,
                    "max_abs_logit": 1.0 + slope * epoch,
                }
            )
    return pd.DataFrame(results), pd.DataFrame(history)


def test_risk_lines_tell_delay_from_safety():
    results, history = _case({"slow": 1.0, "flat": 0.0, "fast": 2.0, "past": 3.0}, {"fast": 44})
    table = risk_table(results, history).set_index("variant")
    expected = (LINE - 1.0) / 1.0
    assert f"near epoch {expected:.0f}" in table.loc["slow", "risk"]
    assert "only delay" in table.loc["slow", "risk"]
    assert "not heading" in table.loc["flat", "risk"]
    assert table.loc["fast", "risk"].startswith("NaN in 1/1")
    assert "past the line and stayed finite" in table.loc["past", "risk"]
    assert table.loc["slow", "line"] == f"{LINE:.2f} (underflow)"


def test_each_data_set_is_its_own_run():
    # A case may train on several data sets: the same seed on two of them is two runs.
    results, history = _case({"v": 1.0}, {})
    other = results.assign(dataset="e")
    steeper = history.assign(dataset="e", max_abs_logit=1.0 + 2.0 * history["epoch"])
    both = run_risks(pd.concat([results, other]), pd.concat([history, steeper]))
    assert sorted(both["slope"].round(6)) == [1.0, 2.0]


def test_a_run_shorter_than_the_minimum_is_not_extrapolated():
    # The case: 5 epochs of a slowly growing logit once "crossed at epoch 3850".
    short = MIN_TREND_EPOCHS - 1
    results, history = _case({"slow": 0.02}, {}, budget=short)
    table = risk_table(results, history).set_index("variant")
    assert table.loc["slow", "trend crosses it at epoch (finite runs), median"] == "-"
    assert table.loc["slow", "risk"] == (
        f"1 finite run(s) too short to extrapolate (under {MIN_TREND_EPOCHS} epochs)"
    )
    # At the minimum, the same growth is extrapolated.
    results, history = _case({"slow": 0.02}, {}, budget=MIN_TREND_EPOCHS)
    table = risk_table(results, history).set_index("variant")
    assert table.loc["slow", "trend crosses it at epoch (finite runs), median"] != "-"


def _signed_case(high_slope: float, low_slope: float, dtype: str, budget: int = 50):
    """One run whose largest exp argument grows by ``high_slope`` and whose smallest
    per-node max logit falls by ``low_slope`` per epoch."""
    results, history = _case({"v": 0.0}, {}, budget)
    results["dtype"] = dtype
    history["max_exp_arg"] = 1.0 + high_slope * history["epoch"]
    history["min_node_max_logit"] = -1.0 - low_slope * history["epoch"]
    return results, history


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_signed_headroom_heads_for_the_line_of_its_direction_and_dtype(dtype):
    limits = exp_limits(dtype)
    up = run_risks(*_signed_case(1.0, 0.1, dtype)).iloc[0]
    assert (up["line_name"], up["line"]) == ("overflow", limits.overflow)
    assert up["crossing"] == pytest.approx(limits.overflow - 1.0)
    assert up["line_label"] == f"+{limits.overflow:.2f} (overflow)"
    down = run_risks(*_signed_case(0.1, 1.0, dtype)).iloc[0]
    assert (down["line_name"], down["line"]) == ("underflow", limits.underflow)
    assert down["line_label"] == f"-{limits.underflow:.2f} (underflow)"


def test_an_old_history_without_the_signed_columns_keeps_the_nearer_line():
    results, history = _case({"v": 1.0}, {})
    assert run_risks(results, history).iloc[0]["line_name"] == "underflow"


@pytest.mark.parametrize("signed", [False, True])
def test_a_model_without_attention_logits_gets_no_trend_and_says_why(signed):
    results, history = _case({"plain": 0.0, "slow": 1.0}, {"plain": 30})
    plain = history["variant"] == "plain"
    history.loc[plain, "max_abs_logit"] = np.nan  # the model exposes no logits
    if signed:
        history["max_exp_arg"] = history["max_abs_logit"]
        history["min_node_max_logit"] = -history["max_abs_logit"]
    table = risk_table(results, history).set_index("variant")
    row = table.loc["plain"]
    assert "nan" not in " ".join(row.drop("risk").astype(str)).lower()
    assert row["max abs logit growth per epoch, median"] == "—" and row["line"] == "—"
    assert row["trend crosses it at epoch (finite runs), median"] == "—"
    assert row["risk"] == (
        "NaN in 1/1 runs; 1/1 run(s) recorded no attention logit (the model exposes none): "
        "no trend toward exp's lines"
    )
    assert table.loc["slow", "max abs logit growth per epoch, median"] == "+1.000"
    assert "no attention logit" not in table.loc["slow", "risk"]
