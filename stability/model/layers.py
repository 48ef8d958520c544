"""The seed's message-passing layer and the edge-feature transform in front of it."""

from __future__ import annotations

from typing import Any

import keras
import tensorflow as tf

from stability.model.logit_transforms import get_logit_transform
from stability.model.softmax import get_softmax

EDGE_MODES = ("raw", "sigmoid", "normalized", "relu", "none")


@keras.saving.register_keras_serializable(package="stability")
class EdgeFeature(keras.layers.Layer):
    """The edge feature ``e`` as the attention sees it.

    Modes: ``raw`` (the seed), ``sigmoid`` (``sigmoid(e)``), ``normalized``
    (``(e - mean) / std`` with the training set's statistics), ``relu`` (``relu(e)``) and
    ``none`` (``e`` left out).

    Shapes: ``[num_edges, 1]`` -> ``[num_edges, 1]`` (``[num_edges, 0]`` for ``none``).
    """

    def __init__(self, mode: str = "raw", mean: float = 0.0, std: float = 1.0, **kwargs: Any):
        super().__init__(**kwargs)
        if mode not in EDGE_MODES:
            raise ValueError(f"EdgeFeature mode {mode!r} must be one of {', '.join(EDGE_MODES)}")
        if std <= 0:
            raise ValueError(f"EdgeFeature std {std} must be positive")
        self.mode, self.mean, self.std = mode, float(mean), float(std)

    def call(self, edges: tf.Tensor) -> tf.Tensor:
        if self.mode == "sigmoid":
            return tf.sigmoid(edges)
        if self.mode == "normalized":
            return (edges - self.mean) / self.std
        if self.mode == "relu":
            return tf.nn.relu(edges)
        if self.mode == "none":
            return edges[:, :0]
        return edges

    def get_config(self) -> dict[str, Any]:
        return {**super().get_config(), "mode": self.mode, "mean": self.mean, "std": self.std}


@keras.saving.register_keras_serializable(package="stability")
class AttentionMessagePassing(keras.layers.Layer):
    """One round of the seed's attention message passing.

    For each edge ``j -> i`` with edge feature ``e_ij``::

        z_ij     = concat((v_i + v_j) / 2, e_ij)            # [num_edges, hidden + 1]
        a_ij     = Net(z_ij)                                 # [num_edges, 1], one Dense layer
        alpha_ij = softmax_j(a_ij) over the edges into i     # [num_edges, 1]
        m_ij     = relu(W z_ij + b)                          # [num_edges, hidden]
        v_i'     = v_i + sum_j alpha_ij * m_ij               # [num_nodes, hidden]

    Source: the question "Gradient exploding problem in a graph neural network" (see
    ``shared/seed``); ``Net`` there is "a single layer feed-forward network".

    Args:
        hidden: width of the node state ``v`` and the message.
        softmax: "naive" (the seed's) or "stable" (max-subtracted), see ``stability.model.softmax``.
        net_kernel_constraint: a Keras constraint for ``Net``'s kernel, or None.
        net_kernel_regularizer: a Keras regularizer for ``Net``'s kernel, or None.
        logit_transform: applied to ``Net``'s logits before the softmax ("none", or a name
            registered with ``register_logit_transform``).

    Shapes:
        inputs: nodes ``[num_nodes, hidden]``, edge features ``[num_edges, k]``,
            senders and receivers ``[num_edges]``, and an optional ``edge_mask``
            ``[num_edges]`` bool that is False on the padding edges of a padded batch.
        outputs: nodes ``[num_nodes, hidden]``, logits ``[num_edges, 1]``, alpha
            ``[num_edges, 1]``.
    """

    def __init__(
        self,
        hidden: int,
        softmax: str = "naive",
        net_kernel_constraint: Any = None,
        net_kernel_regularizer: Any = None,
        logit_transform: str = "none",
        **kwargs: Any,
    ):
        super().__init__(**kwargs)
        self.hidden = int(hidden)
        self.softmax = softmax
        self._softmax_fn = get_softmax(softmax)
        self.logit_transform = logit_transform
        self._transform_fn = get_logit_transform(logit_transform)
        self.net = keras.layers.Dense(
            1,
            kernel_constraint=keras.constraints.get(net_kernel_constraint),
            kernel_regularizer=keras.regularizers.get(net_kernel_regularizer),
            name="net",
            dtype=self.dtype_policy,
        )
        self.message = keras.layers.Dense(
            self.hidden, activation="relu", name="message", dtype=self.dtype_policy
        )

    def use_softmax(self, name: str) -> None:
        """Switch to the registered softmax ``name`` (the doctor's stable-softmax remedy)."""
        self._softmax_fn = get_softmax(name)
        self.softmax = name

    def use_logit_transform(self, name: str) -> None:
        """Switch to the registered logit transform ``name`` (the doctor's logit remedy)."""
        self._transform_fn = get_logit_transform(name)
        self.logit_transform = name

    def build(self, input_shape: Any = None, edge_width: int = 1) -> None:
        z_shape = (None, self.hidden + edge_width)
        self.net.build(z_shape)
        self.message.build(z_shape)
        self.built = True

    def call(
        self,
        nodes: tf.Tensor,
        edge_features: tf.Tensor,
        senders: tf.Tensor,
        receivers: tf.Tensor,
        edge_mask: tf.Tensor | None = None,
    ) -> tuple[tf.Tensor, tf.Tensor, tf.Tensor]:
        num_nodes = tf.shape(nodes)[0]
        # [num_edges, hidden]
        neighbors_mean = 0.5 * (tf.gather(nodes, receivers) + tf.gather(nodes, senders))
        # [num_edges, hidden + k]
        z = tf.concat([neighbors_mean, tf.cast(edge_features, nodes.dtype)], axis=-1)
        # [num_edges, 1]
        logits = self._transform_fn(self.net(z))
        if edge_mask is not None:
            # Padding edges (stability.data.padding) get a logit of 0: exp(0) = 1 can neither
            # overflow nor vanish, so padding never makes a NaN of its own, and the where
            # passes no gradient to the padding's logits. Real edges are untouched.
            logits = tf.where(edge_mask[:, None], logits, tf.zeros_like(logits))
        alpha = self._softmax_fn(logits, receivers, num_nodes)
        # [num_edges, hidden]
        messages = alpha * self.message(z)
        # [num_nodes, hidden]
        updated = nodes + tf.math.unsorted_segment_sum(messages, receivers, num_nodes)
        return updated, logits, alpha

    def get_config(self) -> dict[str, Any]:
        return {
            **super().get_config(),
            "hidden": self.hidden,
            "softmax": self.softmax,
            "logit_transform": self.logit_transform,
            "net_kernel_constraint": keras.constraints.serialize(self.net.kernel_constraint),
            "net_kernel_regularizer": keras.regularizers.serialize(self.net.kernel_regularizer),
        }
