"""The seed's graph network: embed, attention message passing, sum readout, (mean, log sigma)."""

from __future__ import annotations

from typing import Any

import keras
import tensorflow as tf

from stability.model.layers import AttentionMessagePassing, EdgeFeature


@keras.saving.register_keras_serializable(package="stability")
class GraphNetwork(keras.Model):
    """The seed's model.

    ``v = Dense(hidden)(x)``; ``num_layers`` rounds of ``AttentionMessagePassing``; a sum
    readout per graph; ``Dense(hidden, relu)``; ``Dense(2)`` giving (mean, log sigma).

    The relu in the head matters for the harness: inside ``tf.function`` the fused
    MatMul+BiasAdd+Relu kernel maps NaN to 0, so NaN node states can leave the loss finite.

    Inputs: the dict of ``GraphBatch.as_inputs()``. Output: ``[num_graphs, 2]``. A padded
    batch (``stability.data.padding``) also carries ``edge_mask`` and ``graph_mask``; padding
    edges then get a logit of 0 and padding graphs a prediction of 0.
    """

    def __init__(
        self,
        num_features: int,
        hidden: int = 32,
        num_layers: int = 1,
        edge_mode: str = "raw",
        edge_mean: float = 0.0,
        edge_std: float = 1.0,
        softmax: str = "naive",
        net_kernel_constraint: Any = None,
        net_kernel_regularizer: Any = None,
        logit_transform: str = "none",
        **kwargs: Any,
    ):
        super().__init__(**kwargs)
        self.num_features, self.hidden, self.num_layers = num_features, hidden, num_layers
        self.embed = keras.layers.Dense(hidden, name="embed", dtype=self.dtype_policy)
        self.edge_feature = EdgeFeature(
            edge_mode, edge_mean, edge_std, name="edge_feature", dtype=self.dtype_policy
        )
        self.passes = [
            AttentionMessagePassing(
                hidden,
                softmax=softmax,
                net_kernel_constraint=net_kernel_constraint,
                net_kernel_regularizer=net_kernel_regularizer,
                logit_transform=logit_transform,
                name=f"message_passing_{k}",
                dtype=self.dtype_policy,
            )
            for k in range(num_layers)
        ]
        self.head_hidden = keras.layers.Dense(
            hidden, activation="relu", name="head_hidden", dtype=self.dtype_policy
        )
        self.head = keras.layers.Dense(2, name="head", dtype=self.dtype_policy)
        self._build_all()

    def _build_all(self) -> None:
        # Every weight exists from construction on, so the optimizer and a reloaded model
        # see the same variables without a first call.
        self.embed.build((None, self.num_features))
        edge_width = 0 if self.edge_feature.mode == "none" else 1
        for layer in self.passes:
            layer.build(None, edge_width=edge_width)
        self.head_hidden.build((None, self.hidden))
        self.head.build((None, self.hidden))
        self.built = True

    def forward(self, inputs: dict[str, tf.Tensor]) -> dict[str, Any]:
        """Predictions plus the tensors the sentinel watches.

        Returns ``predictions`` ``[num_graphs, 2]``, and per message-passing layer
        ``logits`` and ``alpha`` (each a list of ``[num_edges, 1]``), the ``receivers`` the
        weights are normalized over (a list of ``[num_edges]``), the layers' names
        (``attention_layers``) and whether each softmax subtracts the segment maximum
        (``softmax_shifted``: then ``exp`` never sees the raw logit). The trainer checks
        that every node's weights sum to 1 (docs/plugins.md, "The forward contract").
        """
        # [num_nodes, hidden]
        nodes = self.embed(tf.cast(inputs["nodes"], self.compute_dtype))
        # [num_edges, 1]
        edge_features = self.edge_feature(tf.cast(inputs["edges"], self.compute_dtype))
        logits, alphas = [], []
        for layer in self.passes:
            nodes, logit, alpha = layer(
                nodes,
                edge_features,
                inputs["senders"],
                inputs["receivers"],
                edge_mask=inputs.get("edge_mask"),
            )
            logits.append(logit)
            alphas.append(alpha)
        # [num_graphs, hidden]
        pooled = tf.math.unsorted_segment_sum(nodes, inputs["node_graph"], inputs["num_graphs"])
        # Under a mixed policy the head computes in float16; the loss (its exp(-log sigma))
        # gets the predictions in the weights' dtype, as Keras' mixed-precision guide advises.
        predictions = tf.cast(self.head(self.head_hidden(pooled)), self.dtype_policy.variable_dtype)
        if "graph_mask" in inputs:
            # A padding graph predicts (mean 0, log sigma 0) against a target of 0, so its
            # term of the seed's loss is exactly 0 and passes no gradient.
            predictions = tf.where(
                inputs["graph_mask"][:, None], predictions, tf.zeros_like(predictions)
            )
        return {
            "predictions": predictions,
            "logits": logits,
            "alpha": alphas,
            "receivers": [inputs["receivers"]] * len(self.passes),
            "attention_layers": [layer.name for layer in self.passes],
            "softmax_shifted": [layer.softmax == "stable" for layer in self.passes],
        }

    def call(self, inputs: dict[str, tf.Tensor]) -> tf.Tensor:
        return self.forward(inputs)["predictions"]

    def get_config(self) -> dict[str, Any]:
        first = self.passes[0] if self.passes else None
        return {
            **super().get_config(),
            "num_features": self.num_features,
            "hidden": self.hidden,
            "num_layers": self.num_layers,
            "edge_mode": self.edge_feature.mode,
            "edge_mean": self.edge_feature.mean,
            "edge_std": self.edge_feature.std,
            "softmax": first.softmax if first else "naive",
            "logit_transform": first.logit_transform if first else "none",
            "net_kernel_constraint": first.get_config()["net_kernel_constraint"] if first else None,
            "net_kernel_regularizer": (
                first.get_config()["net_kernel_regularizer"] if first else None
            ),
        }
