"""The report layer: per-variant summaries, risk lines, plots, case reports, claims and compare."""
