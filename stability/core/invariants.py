"""The invariants of a graph network, by name: what ``stability check`` tests
(``stability.check.properties``) and what a silent zoo bug breaks (``ZooBug.invariant``).

- ``node_permutation``: renumbering a graph's nodes leaves its prediction unchanged;
- ``edge_order``: the order of the edge list changes nothing;
- ``batch_independence``: a graph's prediction does not depend on the other graphs of its
  batch;
- ``edge_continuity``: a prediction moves by a bounded amount as an edge distance moves by a
  small step, and across a declared cutoff;
- ``dtype_agreement``: float32 and float64 with the same weights agree within a bound that
  grows with the depth;
- ``attention_normalization``: the attention a model exposes sums to 1 per node.
"""

#: Every invariant, in the order reports list them.
INVARIANTS = (
    "node_permutation",
    "edge_order",
    "batch_independence",
    "edge_continuity",
    "dtype_agreement",
    "attention_normalization",
)
