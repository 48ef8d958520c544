"""The float64 section of claims.md, driven by planted rows: each sentence changes with them.

The last test is the float64 smoke run: the seed's float64 case cut down to a few graphs and
epochs, through the command line, into a claims.md whose float64 section reads its rows.
"""

import math
import re
from pathlib import Path

import pandas as pd
from test_claims import SEED_TEXT, seed_frame

from stability import cli
from stability.claims.float64 import CLAIM_VARIANTS, COMMAND, QUOTES, float64_section
from stability.claims.report import claims_markdown
from stability.claims.rules import Rules
from stability.claims.stats import ClaimInputs
from stability.claims.table import NOT_REPRODUCED, NOT_RUN, REPRODUCED, SEED_CLAIMS, judge
from stability.core.failures import failure_cause
from stability.report.writer import read_results

ROOT = Path(__file__).parent.parent
RULES = Rules()
INPUTS = ClaimInputs(seed=None, batch_size=None, learning_rate=None, train_graphs=320)
#: The float32 verdicts of a seed case where every claim comes out as the seed tells it.
FLOAT32 = judge(
    ClaimInputs(seed=seed_frame(), batch_size=None, learning_rate=None, train_graphs=320)
)

#: variant -> (first-failure epoch per seed, None = finite; final MAE): float64 planted rows.
SPEC = {
    "raw_e": ([40, 45, 50], math.nan),
    "no_e": ([None] * 3, 2.0),
    "sigmoid_e": ([None] * 3, 1.5),
    "weight_constrained": ([None] * 3, 1.0),
    "stable_softmax": ([None] * 3, 1.02),
}


def planted(spec=None, budget=160, at_failure=(1.0, -708.9), top=710.0, high=1.0, flat=None):
    """(rows, history) of a float64 seed case. A failing run's max abs logit grows linearly
    to ``top`` at its failure epoch, where its (largest exp argument, smallest per-node max
    logit) are ``at_failure``; before it they are (``high``, -logit). A finite run stays at 5.
    ``flat`` maps (variant, seed) to a max abs logit held in every epoch of that run."""
    flat = flat or {}
    spec = {**SPEC, **(spec or {})}
    rows, history = [], []
    for variant, (epochs, mae) in spec.items():
        for seed, fail in enumerate(epochs):
            nan = fail is not None
            run = {"variant": variant, "seed": seed, "batch_size": 32, "learning_rate": 0.01}
            logits = [top * e / fail if nan else 5.0 for e in range(1, (fail or budget) + 1)]
            logits = [flat.get((variant, seed), value) for value in logits]
            for epoch, logit in enumerate(logits, start=1):
                last = nan and epoch == fail
                history.append(
                    {
                        **run,
                        "epoch": epoch,
                        "max_abs_logit": logit,
                        "max_exp_arg": at_failure[0] if last else high,
                        "min_node_max_logit": at_failure[1] if last else -logit,
                    }
                )
            rows.append(
                {
                    **run,
                    "case": "seed_float64",
                    "epochs": budget,
                    "dtype": "float64",
                    "first_nan_epoch": fail if nan else math.nan,
                    "first_nan_step": (fail - 1) * 10 + 3 if nan else math.nan,
                    "first_nan_where": "forward" if nan else None,
                    "first_nan_op": "RealDiv (softmax_div)" if nan else None,
                    "failure_kind": "nonfinite" if nan else None,
                    "final_mae": math.nan if nan else mae,
                    "max_abs_logit": max(logits),
                    "max_exp_arg": max(high, at_failure[0]) if nan else high,
                    "min_node_max_logit": min(at_failure[1], -max(logits)) if nan else -5.0,
                }
            )
    return pd.DataFrame(rows), pd.DataFrame(history)


def section(frame, history, float32=FLOAT32):
    return float64_section(frame, history, float32, INPUTS, RULES)


def table_row(text: str, claim: str) -> list[str]:
    line = next(line for line in text.splitlines() if line.startswith(f"| {claim} "))
    return [cell.strip() for cell in line.strip("|").split("|")]


def test_the_seed_is_quoted_verbatim():
    seed = " ".join(SEED_TEXT.read_text(encoding="utf-8").split())
    for name, quote in QUOTES.items():
        for piece in re.findall(r'"(.*?)"(?:;|$)', quote):
            assert " ".join(piece.split()) in seed, f"{name}: {piece!r} is not in the seed"


def test_absent_case_names_the_command_that_makes_it():
    text = section(None, None)
    assert "absent" in text and COMMAND in text
    assert "| C1a " not in text


def test_claim_variants_are_the_variants_the_rules_read():
    assert set(CLAIM_VARIANTS) == set(SEED_CLAIMS)
    for claim, variants in CLAIM_VARIANTS.items():
        for variant in variants:
            if variant == "raw_e":
                continue
            frame = seed_frame().query(f"variant != '{variant}'")
            inputs = ClaimInputs(seed=frame, batch_size=None, learning_rate=None, train_graphs=320)
            out = {v.id: v for v in judge(inputs)}[claim]
            assert out.verdict == NOT_RUN and f"no {variant} rows" in out.why, (claim, out)


def test_both_verdicts_side_by_side_and_the_change_named():
    text = section(*planted())
    for claim in ("C1a", "C3", "C9", "C10", "C11a"):
        assert table_row(text, claim)[2:4] == [REPRODUCED, REPRODUCED], claim
    assert table_row(text, "C11b")[3] == NOT_REPRODUCED  # the division, not exp
    assert "The dtype changes 1 of these 8 verdicts: C11b" in text
    failing = section(*planted({"stable_softmax": ([None, 90, None], 1.0)}))
    assert table_row(failing, "C10")[2:4] == [REPRODUCED, NOT_REPRODUCED]
    assert "C10 (reproduced in float32, not reproduced in float64)" in failing


def test_claims_not_in_the_case_follow_its_variants():
    text = section(*planted())
    assert "C2a, C2b, C8a, C8b (they need other batch sizes or learning rates" in text
    assert "C5 (no relu_e rows); C6 (no grad_clip rows); C7 (no sigma_clip rows)" in text
    frame, history = planted()
    keep = frame["variant"] != "weight_constrained"
    fewer = section(frame[keep], history[history["variant"] != "weight_constrained"])
    assert "| C9 " not in fewer and "C9 (no weight_constrained rows)" in fewer
    assert "7 verdicts" in fewer


def test_a_short_budget_says_why_avoiding_is_not_run():
    long = section(*planted(budget=160))
    assert "at least 3 x raw_e's float64 median first-failure epoch (45)" in long
    short = section(*planted(budget=100))
    assert "under 3 x raw_e's float64 median first-failure epoch (45), that is 135" in short
    assert "C3, C4, C9, C10 are *not run* in float64" in short
    assert table_row(short, "C3")[3] == NOT_RUN


def test_c11_the_signed_logit_against_each_line():
    under = section(*planted(at_failure=(-88.0, -708.9)))
    assert "above +709.78 in none of 3 failing runs" in under
    assert "below -708.40 in 3 of 3 (seeds 0, 1, 2)" in under
    assert "| 0      | 40 " in under and "-708.90" in under and "-0.50" in under
    over = section(*planted(at_failure=(710.5, -3.0)))
    assert "above +709.78 in 3 of 3 failing runs (seeds 0, 1, 2)" in over
    assert "below -708.40 in none of 3" in over and "-0.72" in over
    inside = section(*planted(at_failure=(3.0, -3.0)))
    assert "neither line was crossed in 3 of 3" in inside
    assert "at epochs 40, 45, 50 (median 45)" in under


def test_c11_without_a_history_uses_the_rows():
    frame, _ = planted()
    text = section(frame, None)
    assert "over each run (the result row" in text
    assert "no history, so the logits per epoch are not known" in text


def test_logits_in_the_hundreds_before_the_failure():
    text = section(*planted(top=710.0))
    # 710 * e / 40 >= 100 from epoch 6; 45 -> 7; 50 -> 8.
    assert "reached 100 before the failure in 3 of 3 raw_e runs (seeds 0, 1, 2)" in text
    assert "first at epoch 6 to 8" in text
    assert "It reached 1000 in none of 3." in text
    assert "were negative" in text
    small = section(*planted(top=60.0))
    assert "In no raw_e run did the max abs logit reach 100 before the failure" in small
    assert "the largest was 58.8" in small  # 60 * 49 / 50: the failure epoch is not before
    thousands = section(*planted(flat={("raw_e", 1): 1500.0}))
    assert "It reached 1000 in 1 of 3 (seeds 1)." in thousands
    positive = section(*planted(high=150.0))
    assert "positive logits of that size occurred" in positive


def test_the_readme_check_still_reads_the_main_verdicts(tmp_path):
    """test_docs compares README's verdicts with claims.md's: the float64 table is skipped."""
    from test_docs import verdicts

    frame, history = planted({"stable_softmax": ([None, 90, None], 1.0)})
    text = claims_markdown(FLOAT32, RULES, "summary", float64=section(frame, history))
    (tmp_path / "claims.md").write_text(text, encoding="utf-8")
    assert "| C10 " in text.split("## The seed in float64")[1]
    assert verdicts(tmp_path / "claims.md") == {v.id: v.verdict for v in FLOAT32}


def test_failure_cause_prefers_the_column_and_falls_back():
    row = pd.Series(
        {"first_nan_epoch": 5, "first_nan_where": "forward", "first_nan_op": "Exp (softmax_exp)"}
    )
    assert failure_cause(row) == "forward overflow"
    assert failure_cause(row.replace("Exp (softmax_exp)", "RealDiv (softmax_div)")) == (
        "forward underflow (0/0)"
    )
    assert failure_cause(pd.concat([row, pd.Series({"failure_cause": "loss"})])) == "loss"
    finite = pd.Series({"first_nan_epoch": math.nan, "first_nan_where": None})
    assert failure_cause(finite) == "none"
    masked = pd.concat([row, pd.Series({"failure_kind": "masked_gradient"})])
    assert failure_cause(masked) == "masked gradient"


def test_float64_smoke_through_the_command_line(tmp_path):
    """The float64 seed case cut down (32 graphs, 2 epochs, 2 variants) runs and renders."""
    small = ["--set", "dataset.num_graphs=32", "--set", "seeds=[0]"]
    run = [
        "run",
        str(ROOT / "cases" / "seed_float64.toml"),
        *small,
        "--set",
        "epochs=2",
        "--variants",
        "raw_e,stable_softmax",
        "--out",
        str(tmp_path),
        "--no-progress",
    ]
    assert cli.main(run) == 0
    rows = read_results(tmp_path / "seed_float64.csv")
    assert set(rows["dtype"]) == {"float64"} and len(rows) == 2
    claims = ["claims", "--cases", str(ROOT / "cases"), "--no-run", "--out", str(tmp_path)]
    assert cli.main([*claims, "--set", "dataset.num_graphs=32"]) == 0
    text = (tmp_path / "claims.md").read_text(encoding="utf-8")
    part = text[text.index("## The seed in float64") :]
    assert "at dtype float64, variants raw_e, stable_softmax; seeds 0; batch 32" in part
    assert "learning rate 0.01; 2 epochs" in part
    assert "| C1a " in part and "| C3 " not in part and "C3 (no no_e rows)" in part
    assert "### C11 in float64" in part and "### Logits before the failure" in part


def test_rows_at_another_setting_are_not_judged():
    frame, history = planted()
    frame["batch_size"] = 128
    text = section(frame, history)
    assert "no rows at the seed's setting (batch 32, learning rate 0.01)" in text
    assert "| C1a " not in text
