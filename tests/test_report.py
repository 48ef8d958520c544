"""The markdown report rendered from the committed seed CSVs: summary, risk and plots."""

from pathlib import Path

import numpy as np
import pandas as pd

from stability.report.writer import read_history, read_results, summary_table, write_reports

REPORTS = Path(__file__).parent.parent / "reports"


def test_relative_mae_is_against_the_best_variant_that_never_hit_nan():
    frame = read_results(REPORTS / "seed.csv")
    never = frame.groupby("variant").filter(lambda g: g["first_nan_epoch"].isna().all())
    medians = never.groupby("variant")["final_mae"].median()
    table = summary_table(frame).set_index("variant")
    assert table.loc[medians.idxmin(), "final MAE / best finite"] == "1.00x"
    worst = medians.idxmax()
    ratio = medians.max() / medians.min()
    assert table.loc[worst, "final MAE / best finite"] == f"{ratio:.2f}x"
    for variant, group in frame.groupby("variant"):
        if group["first_nan_epoch"].notna().any():
            assert table.loc[variant, "final MAE / best finite"] == "-"


def test_report_links_the_plots_it_writes(tmp_path):
    frame = read_results(REPORTS / "seed.csv")
    history = read_history(REPORTS / "seed.history.csv")
    path = write_reports(frame, tmp_path, "seed", history=history)
    markdown = path.read_text()
    for png in ("seed.logits.png", "seed.mae.png"):
        assert f"({png})" in markdown
        assert (tmp_path / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "## Risk" in markdown and "87.34 (underflow)" in markdown
    assert "final MAE, median [IQR]" in markdown


def test_report_without_history_has_no_plots(tmp_path):
    frame = read_results(REPORTS / "seed.csv")
    markdown = write_reports(frame, tmp_path, "seed").read_text()
    assert "## Risk" not in markdown and not list(tmp_path.glob("*.png"))
    assert read_history(tmp_path / "absent.history.csv") is None
    assert isinstance(frame, pd.DataFrame)


def test_the_failing_layer_and_op_of_each_failing_setting_are_listed():
    frame = read_results(REPORTS / "seed.csv")
    table = summary_table(frame).set_index("variant")
    for variant, group in frame.groupby("variant"):
        failed = group[group["first_nan_epoch"].notna()]
        cell = table.loc[variant, "failing layer: op"]
        if failed.empty:
            assert cell == "-"
            continue
        counts = failed.groupby(["first_nan_layer", "first_nan_op"]).size()
        expected = ", ".join(f"{lay}: {op} {n}/{len(group)}" for (lay, op), n in counts.items())
        assert cell == expected


def test_divergence_is_shown_beside_the_warnings_from_the_rows(tmp_path):
    # The committed rows without their divergences (stable_softmax seed 0 diverges at epoch
    # 187 on the CPU that made them): the column shows only where a row has one.
    frame = read_results(REPORTS / "seed.csv").assign(diverged_epoch=float("nan"))
    assert "diverged (before any NaN)" not in summary_table(frame)
    plain = write_reports(frame, tmp_path, "seed").read_text()
    assert "diverged_epoch" not in plain
    finite = frame.index[frame["first_nan_epoch"].isna()]
    row = frame.loc[finite[0]]
    frame.loc[finite[0], "diverged_epoch"] = 123
    table = summary_table(frame).set_index("variant")
    runs = (frame["variant"] == row["variant"]).sum()
    cell = table.loc[row["variant"], "diverged (before any NaN)"]
    assert cell == f"1/{runs}: epoch 123 (seed {row['seed']})"
    others = table.drop(index=row["variant"])["diverged (before any NaN)"]
    assert (others == "-").all()
    markdown = write_reports(frame, tmp_path, "seed").read_text()
    assert "(`diverged_epoch`)" in markdown and "A warning, not a NaN" in markdown


def test_the_settings_say_what_the_data_sets_held(tmp_path):
    from stability.data import load_dataset
    from stability.report.writer import markdown_report

    frame = read_results(REPORTS / "generated.csv")
    data = load_dataset("generated", seed=0, num_graphs=30, max_outlier=40.0)
    text = markdown_report(frame, "generated", datasets=[data])
    train, val = len(data.train), len(data.val)
    distances = np.concatenate([g.edges.ravel() for g in data.train + data.val])
    received = sum(
        int((np.bincount(g.receivers, minlength=g.num_nodes) == 0).sum())
        for g in data.train + data.val
    )
    assert f"| graphs (train / validation) | {train} / {val}" in " ".join(text.split())
    assert (
        f"{distances.size} edges, distances {distances.min():.3g} to {distances.max():.3g}" in text
    )
    assert f"{received} (" in text
    assert "graphs (train" not in markdown_report(frame, "generated")  # no data sets: no rows
