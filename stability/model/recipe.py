"""What a variant is: its builder's input (``BuildContext``), what it builds (``Recipe``) and
the named builder itself (``Variant``). The registry of variants is ``variants``; the
doctor's remedies (``remedies``) change built recipes."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import keras
import tensorflow as tf

from stability.model.losses import robust_loss

Loss = Callable[[tf.Tensor, tf.Tensor], tf.Tensor]

GradientTransform = Callable[[list[tf.Tensor]], list[tf.Tensor]]


@dataclass(frozen=True)
class BuildContext:
    """What a variant may depend on: the data's shape and statistics and the case settings."""

    num_features: int
    hidden: int
    num_layers: int
    learning_rate: float
    edge_mean: float
    edge_std: float
    dtype: str = "float32"


@dataclass(frozen=True)
class Recipe:
    """A variant, built: what the trainer trains.

    ``model.forward(inputs)`` should return a dict with ``predictions`` and lists of
    ``logits``/``alpha`` (see ``GraphNetwork.forward``); a model with only ``call`` works too,
    without attention diagnostics.
    """

    model: keras.Model
    optimizer: keras.optimizers.Optimizer
    loss: Loss = robust_loss
    gradient_transform: GradientTransform | None = None


@dataclass(frozen=True)
class Variant:
    """A named builder. ``adjust``, where set, changes the recipe once its model is built
    and checked (``Trainer.build``): a doctor's remedy (``stability.model.remedies``) that
    needs the model's weights to exist, such as a kernel constraint, is one."""

    name: str
    description: str
    build: Callable[[BuildContext], Recipe]
    adjust: Callable[[Recipe, BuildContext], Recipe] | None = None
