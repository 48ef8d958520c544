"""``GuardedOptimizer``: a user's Keras optimizer behind a step guard, for ``NanSentinel``.

Keras guards an update by wrapping the optimizer: ``LossScaleOptimizer`` takes the inner
optimizer, checks the gradients and applies the update under a condition. This wrapper does
the same through the same public seam (an ``Optimizer`` subclass whose ``apply`` every
``train_step`` calls with the step's raw gradients), and hands the gradients and the inner
update to ``guard_step``, which decides whether the update runs. Everything else (the
variables, the step count, the learning rate, the loss scale) is the inner optimizer's, so
the wrapper can be put on a compiled model for one ``fit`` and taken off again.

It serializes as ``LossScaleOptimizer`` does, with the inner optimizer nested under
``inner_optimizer``, but loads as the inner optimizer alone: the guard is one ``fit``'s
closure and cannot be saved, and a model saved while the sentinel watches (a
``ModelCheckpoint`` mid-fit) should load with the user's own optimizer, whose state (the
step count, the slots) is saved under the wrapper as the inner optimizer's variables, so
that ``fit`` continues from it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import keras

#: ``guard_step(gradients, variables, update)``: runs the guard on the step's raw gradients
#: and calls ``update(gradients)`` (the inner optimizer's apply) only where the step may
#: update (under a distribution strategy, once in each replica, with its own gradients).
GuardStep = Callable[[list, list, Callable[[list], Any]], None]


@keras.saving.register_keras_serializable(package="stability")
class GuardedOptimizer(keras.optimizers.Optimizer):
    """``inner`` with every ``apply`` passed through ``guard_step``.

    Args:
        inner: the optimizer the model was compiled with.
        guard_step: the guard (see ``GuardStep``).
    """

    def __init__(self, inner: keras.optimizers.Optimizer, guard_step: GuardStep):
        super().__init__(learning_rate=0.0, name=f"guarded_{inner.name}")
        self.inner, self._guard_step = inner, guard_step

    def build(self, var_list: list) -> None:
        self.inner.build(var_list)
        self.built = True

    def apply(self, grads: Any, trainable_variables: Any = None) -> None:
        grads = list(grads)
        variables = list(trainable_variables) if trainable_variables is not None else None
        if not self.inner.built:  # as Optimizer.apply builds: the guard reads its state
            self.inner.build(variables)
        self._guard_step(grads, variables, lambda g: self.inner.apply(g, variables))

    @property
    def variables(self) -> list:
        return self.inner.variables

    @property
    def iterations(self) -> Any:
        return self.inner.iterations

    @property
    def learning_rate(self) -> Any:
        return self.inner.learning_rate

    @learning_rate.setter
    def learning_rate(self, learning_rate: Any) -> None:
        self.inner.learning_rate = learning_rate

    def scale_loss(self, loss: Any) -> Any:
        return self.inner.scale_loss(loss)

    def finalize_variable_values(self, var_list: list) -> None:
        self.inner.finalize_variable_values(var_list)

    def get_config(self) -> dict:
        # As LossScaleOptimizer's: not super().get_config(), whose fields are the inner's.
        return {
            "name": self.name,
            "inner_optimizer": keras.saving.serialize_keras_object(self.inner),
        }

    @classmethod
    def from_config(
        cls, config: dict, custom_objects: dict | None = None
    ) -> keras.optimizers.Optimizer:
        """The inner optimizer, unguarded (see the module's docstring)."""
        return keras.saving.deserialize_keras_object(
            config["inner_optimizer"], custom_objects=custom_objects
        )
