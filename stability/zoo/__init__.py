"""The zoo: real GNN numerical bugs from public trackers, each a small Keras program written
as its users write it, with a case that triggers it and its ground truth (``bugs/``)."""
