"""Point-GNN trained with plain SGD at its configured learning rate: the residual ReLU
layers without normalization grow with every step until the weights overflow.

WeijingShi/Point-GNN#15 (https://github.com/WeijingShi/Point-GNN/issues/15), "Get the
feature map of PointGNN": a user's Point-GNN (a TensorFlow GNN on LiDAR point clouds) went
NaN in training. The author: "The current training uses a small batch size and basic SGD.
When you decrease the batch size further or increase the learning rate, it is easy to get
Nan. I find gradient clipping and cyclical learning rate helps a lot", with the code to
clip the gradients by their global norm (``tf.clip_by_global_norm(grads, 1.0)``) before
the update; the user: "Thank you, it solves my problem!". The fix is an optimizer setting.

The model is Point-GNN's layer (``models/gnn.py``, ``GraphNetAutoCenter``) as its configs
use it: no normalization (``"normalization_type": "NONE"``), ReLU MLPs, a max over the
incoming edges, a residual update ``h + MLP(max_j MLP([h_j, x_j - (x_i + offset_i)]))``,
and an auto-registration offset predicted from the vertex's own features. Training is its
``"optimizer": "sgd"`` at ``"initial_lr": 0.125`` on a batch of 2 scenes per device (its
``batch_size`` of 4 on 2 GPUs), with its localization loss, a Huber loss weighted 10
(``loc_loss_weight``). The scenes are small point clouds of one object each, in the
sensor's frame (metres, up to 70 m away), and the target is the object's range.

Every gradient stays finite: each SGD step of 0.125 times a large gradient grows the ReLU
layers' weights, and within a few steps a ``Dense`` layer's ``MatMul`` of the grown
weights and activations passes float32's 3.4e38. So the first non-finite value is that
forward ``MatMul``'s Inf (a forward overflow), and the fix bounds the step instead.
"""

import keras
import numpy as np
import tensorflow as tf

from stability import Recipe, register_variant
from stability.data import Dataset, register_dataset
from stability.data.graphs import Graph
from stability.zoo.bug import ZooBug

#: Point-GNN's localization loss weight (``"loc_loss_weight": 10.0``).
LOC_LOSS_WEIGHT = 10.0


class MLP(keras.layers.Layer):
    """ReLU Dense layers without normalization, as Point-GNN's ``multi_layer_fc_fn``."""

    def __init__(self, units, **kwargs):
        super().__init__(**kwargs)
        self.dense = [keras.layers.Dense(u, activation="relu") for u in units]

    def call(self, x):
        for dense in self.dense:
            x = dense(x)
        return x


class GraphNetAutoCenter(keras.layers.Layer):
    """One Point-GNN layer: ``h_i + MLP_h(max_j MLP_f([h_j, x_j - x_i - offset_i]))``.

    ``h`` is ``[num_nodes, hidden]``, ``x`` ``[num_nodes, 3]``; ``senders``/``receivers``
    ``[num_edges]``, every vertex its own neighbour (a radius graph holds the point itself).
    """

    def __init__(self, hidden, **kwargs):
        super().__init__(**kwargs)
        self.offset = keras.Sequential(
            [keras.layers.Dense(hidden, activation="relu"), keras.layers.Dense(3)]
        )
        self.edge_mlp = MLP([hidden, hidden])
        self.update_mlp = MLP([hidden, hidden])

    def call(self, h, x, senders, receivers):
        centred = x + self.offset(h)
        relative = tf.gather(x, senders) - tf.gather(centred, receivers)
        edge = self.edge_mlp(tf.concat([tf.gather(h, senders), relative], axis=-1))
        aggregated = tf.math.unsorted_segment_max(edge, receivers, tf.shape(h)[0])
        return h + self.update_mlp(aggregated)


class PointGNN(keras.Model):
    """Embed each point's intensity, three Point-GNN layers, mean over the scene, a range
    head."""

    def __init__(self, hidden, **kwargs):
        super().__init__(**kwargs)
        self.embed = MLP([hidden])
        self.layers_ = [GraphNetAutoCenter(hidden) for _ in range(3)]
        self.head = keras.Sequential(
            [keras.layers.Dense(hidden, activation="relu"), keras.layers.Dense(1)]
        )

    def call(self, inputs):
        nodes = inputs["nodes"]
        # The nodes are [intensity, x, y, z]: the features and the coordinates.
        h, x = self.embed(nodes[:, :1]), nodes[:, 1:]
        for layer in self.layers_:
            h = layer(h, x, inputs["senders"], inputs["receivers"])
        pooled = tf.math.unsorted_segment_mean(h, inputs["node_graph"], inputs["num_graphs"])
        return self.head(pooled)


def localization_loss(y_true, y_pred):
    """Point-GNN's localization term: a Huber loss weighted ``LOC_LOSS_WEIGHT``."""
    y_true = tf.reshape(tf.cast(y_true, y_pred.dtype), tf.shape(y_pred))
    return LOC_LOSS_WEIGHT * keras.losses.Huber()(y_true, y_pred)


def scene(rng: np.random.Generator, num_points: int, radius: float) -> Graph:
    """One object's points: a 4 m x 2 m x 1.5 m box somewhere 5 to 70 m in front of the
    sensor, each point with an intensity in [0, 1]. Edges join points closer than
    ``radius``, each point included (distance 0), both ways."""
    centre = np.array([rng.uniform(5.0, 70.0), rng.uniform(-20.0, 20.0), -1.0])
    points = centre + rng.uniform(-0.5, 0.5, (num_points, 3)) * np.array([4.0, 2.0, 1.5])
    dist = np.linalg.norm(points[:, None] - points[None], axis=-1)
    senders, receivers = np.nonzero(dist < radius)
    intensity = rng.uniform(0.0, 1.0, (num_points, 1))
    return Graph(
        nodes=np.hstack([intensity, points]),
        edges=dist[senders, receivers][:, None],
        senders=senders.astype(np.int32),
        receivers=receivers.astype(np.int32),
        target=float(np.linalg.norm(centre[:2])),
    )


@register_dataset
def zoo_b_point_clouds(
    *,
    seed: int = 0,
    num_graphs: int = 64,
    min_points: int = 8,
    max_points: int = 24,
    radius: float = 4.0,
    val_fraction: float = 0.1,
) -> Dataset:
    """LiDAR-like scenes of one object each: nodes ``[intensity, x, y, z]`` in metres in
    the sensor's frame, a radius graph with self-loops, the object's range as the target."""
    rng = np.random.default_rng(seed)
    graphs = [
        scene(rng, int(rng.integers(min_points, max_points + 1)), radius) for _ in range(num_graphs)
    ]
    return Dataset.split(graphs, seed=seed, val_fraction=val_fraction)


@register_variant
def zoo_b_pointgnn_sgd(ctx):
    """Point-GNN's layers without normalization under plain SGD at its learning rate"""
    return Recipe(
        model=PointGNN(ctx.hidden),
        optimizer=keras.optimizers.SGD(ctx.learning_rate),
        loss=localization_loss,
    )


BUG = ZooBug(
    name="b_pointgnn_sgd",
    source="WeijingShi/Point-GNN#15",
    url="https://github.com/WeijingShi/Point-GNN/issues/15",
    summary=(
        "Point-GNN's unnormalized residual ReLU layers under plain SGD at learning rate "
        "0.125 with 2 scenes a batch: the steps grow the weights until a forward MatMul "
        "overflows"
    ),
    fix_class="optimizer setting",
    variant="zoo_b_pointgnn_sgd",
    stage="forward",
    op="MatMul",
    cause="forward overflow",
    fix="clip the gradients by their global norm (tf.clip_by_global_norm, 1.0) before the update",
)
