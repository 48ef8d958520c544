"""Exploration: the robustness map and the hunt, each a batch of ordinary runs of the sweep
engine, with their reports."""
