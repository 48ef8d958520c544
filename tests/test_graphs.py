import numpy as np
import pytest

from stability.core.errors import DataError
from stability.data import load_dataset
from stability.data.graphs import Graph, batch_graphs, validate_graph


def graph(num_nodes, senders, receivers, target=1.0):
    return Graph(
        nodes=np.ones((num_nodes, 2)),
        edges=np.full((len(senders), 1), 1.5),
        senders=np.array(senders, np.int32),
        receivers=np.array(receivers, np.int32),
        target=target,
    )


def test_batching_offsets_edges_and_keeps_empty_graphs():
    batch = batch_graphs([graph(2, [0], [1]), graph(1, [], []), graph(3, [2, 0], [0, 2])])
    assert batch.num_graphs == 3
    assert batch.nodes.shape == (6, 2) and batch.edges.shape == (3, 1)
    np.testing.assert_array_equal(batch.senders, [0, 5, 3])
    np.testing.assert_array_equal(batch.receivers, [1, 3, 5])
    np.testing.assert_array_equal(batch.node_graph, [0, 0, 1, 2, 2, 2])


@pytest.mark.parametrize(
    ("bad", "message"),
    [
        pytest.param(
            dict(senders=np.array([0, 9], np.int32)), "senders points at node 9", id="index"
        ),
        pytest.param(dict(edges=np.array([[np.nan], [1.0]])), "non-finite distances", id="nan"),
        pytest.param(dict(edges=np.array([[-1.0], [1.0]])), "negative distances", id="neg"),
        pytest.param(dict(target=np.inf), "target inf is not finite", id="target"),
    ],
)
def test_validation_names_graph_and_field(bad, message):
    good = graph(3, [0, 1], [1, 2])
    with pytest.raises(DataError, match="graph 7: .*" + message):
        validate_graph(Graph(**{**good.__dict__, **bad}), 7)


def test_synthetic_is_reproducible_and_in_range():
    a = load_dataset("synthetic", seed=3, num_graphs=30)
    b = load_dataset("synthetic", seed=3, num_graphs=30)
    assert a.key == b.key
    assert [g.target for g in a.train] == [g.target for g in b.train]
    edges = np.concatenate([g.edges for g in a.train + a.val])
    assert edges.min() >= 0.5 and edges.max() < 4.0
    assert len(a.val) == 3 and len(a.train) == 27


@pytest.mark.parametrize(("attend", "pick"), [("nearest", np.argmin), ("farthest", np.argmax)])
def test_synthetic_target_is_the_chosen_neighbours_type_value(attend, pick):
    data = load_dataset("synthetic", seed=1, num_graphs=5, num_types=2, attend=attend)
    for g in data.train:
        values = np.linspace(-1.5, 1.5, 2)[g.nodes.argmax(axis=1)]
        expected = 0.0
        for node in range(g.num_nodes):
            incoming = g.receivers == node
            if incoming.any():
                chosen = g.senders[incoming][pick(g.edges[incoming, 0])]
                expected += values[chosen]
        assert g.target == pytest.approx(expected)
