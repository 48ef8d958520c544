"""``stability check``: a variant's first training step and the invariants of a graph network,
on its case's data and on shrunk generated graphs, without training (docs/check.md)."""
