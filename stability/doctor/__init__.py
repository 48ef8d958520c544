"""The doctor: diagnose a failing variant, rerun it with every remedy that applies, and
report the verdicts."""
