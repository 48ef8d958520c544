"""The markdown report rendered from the committed seed CSVs: summary, risk and plots."""

from pathlib import Path

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
