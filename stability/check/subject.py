"""The model under check: one variant built as a case's first run builds it, untrained (or
with a trained run's weights), and what the check asks of it.

- ``fails(graphs)``, ``failure(graphs)``: the graphs as one batch through one training step
  under the step guard (forward, backward, the update), undone after it; whether it
  failed, and its first failure named as the trainer names it (stage, layer, op, cause);
- ``predict(batch)``: the model's predictions (``training=False``), as float64;
- ``attention_ok(batch)``: whether the attention it exposes sums to 1 per node.

Every compiled function takes the ``input_signature`` of the trainer's step, so a batch of
any size is traced once.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import tensorflow as tf

from stability.core.errors import ModelError, StabilityError
from stability.core.failures import Failure
from stability.core.graph_function import graph_function
from stability.data import Dataset
from stability.data.graphs import Graph, GraphBatch, batch_graphs
from stability.data.padding import Budget, pad_batch
from stability.model.recipe import Recipe
from stability.model.variants import get_variant
from stability.train.config import TrainConfig, storage_dtype
from stability.train.diagnosis import (
    Diagnosis,
    EpochStart,
    Rewind,
    TrainerReplays,
    as_tensors,
    name_failure,
)
from stability.train.forward import forward, normalized
from stability.train.guard import StepReport
from stability.train.step import input_signature, make_train_step
from stability.train.trainer import Trainer

#: The spread of the values ``draw_zero_weights`` gives a zero weight: the size of a trained
#: bias, a fraction of a unit.
ZERO_WEIGHT_SCALE = 0.1


@dataclass
class Subject:
    """``variant`` built for ``dataset`` with ``config``'s settings (``recipe``)."""

    variant: str
    dataset: Dataset
    config: TrainConfig
    recipe: Recipe

    @classmethod
    def build(cls, variant: str, dataset: Dataset, config: TrainConfig) -> Subject:
        """Build the variant as its run would (seeded, probed); no step is taken."""
        recipe = Trainer(get_variant(variant), dataset, config).build()
        return cls(variant, dataset, config, recipe)

    def __post_init__(self) -> None:
        dtype = storage_dtype(self.config.dtype)
        self.dtype = dtype
        signature = input_signature(self.dataset.num_features, dtype)
        self._step = make_train_step(self.recipe, signature, guard=True)
        model = self.recipe.model

        def outputs_of(training: bool) -> Any:
            @graph_function(input_signature=signature[:1], reduce_retracing=True)
            def outputs(inputs: dict[str, tf.Tensor]) -> tuple[tf.Tensor, tf.Tensor]:
                out = forward(model, inputs, training=training)
                return tf.cast(out["predictions"], tf.float64), normalized(out, inputs)

            return outputs

        self._outputs = outputs_of(False)
        self._training_outputs = outputs_of(True)
        padded = input_signature(self.dataset.num_features, dtype, padded=True)

        @graph_function(input_signature=padded[:1], reduce_retracing=True)
        def padded_outputs(inputs: dict[str, tf.Tensor]) -> tf.Tensor:
            return tf.cast(forward(model, inputs, training=False)["predictions"], tf.float64)

        self._padded_outputs = padded_outputs
        self._twin: Subject | None = None
        self._twin_error: ModelError | None = None
        self._before: list[tf.Tensor] | None = None
        self._restore: Any = None
        self._stochastic: bool | None = None
        self.drawn = False  # whether ``draw_zero_weights`` ran

    def batch(self, graphs: Sequence[Graph]) -> GraphBatch:
        """``graphs`` as one batch, each target standardized as the trainer's."""
        data = self.dataset
        targets = (np.array([g.target for g in graphs], np.float64) - data.target_mean) / (
            data.target_std
        )
        return batch_graphs(list(graphs), targets=targets, dtype=self.dtype)

    def _state(self) -> tuple[list[tf.Variable], list[tf.Tensor]]:
        """Every variable a step changes and its value before any step: read once, and again
        after ``draw_zero_weights`` changes them (``_before`` is reset there)."""
        state = [*self.recipe.model.variables, *self.recipe.optimizer.variables]
        if self._before is None:
            self._before = [tf.identity(v) for v in state]
        return state, self._before

    def _put_back(self) -> None:
        """Every variable back to its value before the step, in one compiled call (a Python
        loop of assigns cost more than the step itself)."""
        if self._restore is None:
            state = [*self.recipe.model.variables, *self.recipe.optimizer.variables]

            @graph_function()
            def restore(values: list[tf.Tensor]) -> None:
                for variable, value in zip(state, values, strict=True):
                    variable.assign(value)

            self._restore = restore
        self._restore(self._state()[1])

    @contextlib.contextmanager
    def _undone(self) -> Iterator[None]:
        """Inside the block a training step may change any variable of the model and the
        optimizer; after it every one is back as it was before the block."""
        self._state()  # the values to put back, read before the first step
        try:
            yield
        finally:
            self._put_back()

    def _report(self, batch: GraphBatch) -> StepReport:
        return StepReport.of(self._step(batch.as_inputs(), batch.targets).numpy())

    def fails(self, graphs: Sequence[Graph]) -> bool:
        """Whether one training step on ``graphs`` fails a check of the guard (the step's
        update undone after it)."""
        with self._undone():
            return not self._report(self.batch(graphs)).ok

    def failure(self, graphs: Sequence[Graph]) -> Failure | None:
        """The first failure of one training step on ``graphs`` (forward, backward and the
        update, every variable of the model and the optimizer put back after it), named as
        the trainer names it (a replay, op by op: slower than ``fails``), or None."""
        batch = self.batch(graphs)
        with self._undone():
            report = self._report(batch)
            if report.ok:
                return None
            diagnosis = Diagnosis(self.recipe, self.dataset, self.config)
            # An update failure is replayed op by op from the state before the step.
            before = [v.numpy() for v in self._state()[1]]
            start = EpochStart(before, np.random.default_rng(0).bit_generator.state, steps=1)
            rewind = Rewind(start, self._step, lambda rng: iter(()))
            replays = TrainerReplays(diagnosis, batch, batch, rewind)
            return name_failure(report, replays, 0, 1, self.dtype)

    def predict(self, batch: GraphBatch, training: bool = False) -> np.ndarray:
        """``[num_graphs, outputs]`` float64: the predictions of ``batch``'s graphs; with
        ``training``, as the training step computes them (a batch normalization with the
        batch's own statistics), leaving the model's state (moving averages) as it was."""
        if training:
            state = [v.numpy() for v in self.recipe.model.non_trainable_variables]
            predictions = self._training_outputs(batch.as_inputs())[0].numpy()
            for variable, value in zip(
                self.recipe.model.non_trainable_variables, state, strict=True
            ):
                variable.assign(value)
        else:
            predictions = self._outputs(batch.as_inputs())[0].numpy()
        return predictions.reshape(batch.num_graphs, -1) if batch.num_graphs else predictions

    def predict_padded(self, batch: GraphBatch) -> np.ndarray:
        """``[num_graphs, outputs]``: the predictions of ``batch``'s graphs when the batch is
        padded as the trainer pads it under XLA (``stability.data.padding``: a padding graph
        of two nodes and two edges after the real ones, and the masks)."""
        budget = Budget(
            nodes=batch.num_nodes + 2, edges=batch.num_edges + 2, graphs=batch.num_graphs + 1
        )
        padded = pad_batch(batch, budget)
        predictions = self._padded_outputs(padded.as_inputs()).numpy()
        return predictions.reshape(padded.num_graphs, -1)[: batch.num_graphs]

    def stochastic(self, graphs: Sequence[Graph]) -> bool:
        """Whether two passes in the training step's mode differ (dropout, noise): asked of
        the first graphs only, then remembered."""
        if self._stochastic is None:
            batch = self.batch(graphs)
            first, second = self.predict(batch, training=True), self.predict(batch, training=True)
            self._stochastic = not np.array_equal(first, second, equal_nan=True)
        return self._stochastic

    def attention_ok(self, batch: GraphBatch) -> bool:
        """Whether the attention the model exposes sums to 1 per node (True without any)."""
        return bool(self._outputs(batch.as_inputs())[1].numpy())

    @property
    def exposes_attention(self) -> bool:
        """Whether the model's forward pass returns its attention and receivers."""
        batch = self.batch(self.dataset.train[:1])
        out = forward(self.recipe.model, as_tensors(batch.as_inputs()), training=False)
        return bool(out["receivers"])

    def draw_zero_weights(self, seed: int = 0, scale: float = ZERO_WEIGHT_SCALE) -> int:
        """Give every weight that is all zeros (Keras' biases as built) values drawn from
        ``normal(0, scale)``, seeded; returns how many weights were drawn.

        An invariant must hold for any weights, and a zero bias hides every bug on the path
        it feeds: a message that should vanish at a cutoff but keeps a biased term
        (torchmd-net#254) is exactly 0 there until the bias has trained.
        """
        rng = np.random.default_rng(seed)
        drawn = 0
        for weight in self.recipe.model.trainable_variables:
            value = weight.numpy()
            if value.size and not np.any(value):
                weight.assign(rng.normal(0.0, scale, value.shape).astype(value.dtype))
                drawn += 1
        self._twin = None  # a float64 twin copies the weights as they are now
        self._before = None  # and a step puts back the drawn values
        self.drawn = True
        return drawn

    def float64_twin(self) -> Subject | None:
        """The same variant built in float64 with this model's weights (None for a float64
        model); built once. A model that cannot be built in float64 (a float32 constant in
        its code) raises ``ModelError``, every time."""
        if self.config.dtype == "float64":
            return None
        if self._twin is None:
            if self._twin_error is not None:
                raise self._twin_error
            weights = self.recipe.model.get_weights()
            try:
                twin = Subject.build(
                    self.variant, self.dataset, replace(self.config, dtype="float64")
                )
                # The probe ran the model eagerly; traced, a float32 constant may not mix.
                trial = twin.batch(self.dataset.train[:2])
                twin.predict(trial)
                twin.predict(trial, training=True)
            except StabilityError as exc:
                self._twin_error = ModelError(f"cannot be built in float64: {exc}")
                raise self._twin_error from None
            except Exception as exc:  # the user's code, traced in float64
                line = str(exc).strip().splitlines()
                text = f"{type(exc).__name__}: {line[-1] if line else ''}"
                self._twin_error = ModelError(f"cannot run in float64: {text}"[:300])
                raise self._twin_error from None
            twin.recipe.model.set_weights(
                [
                    w.astype(v.dtype)
                    for w, v in zip(weights, twin.recipe.model.get_weights(), strict=True)
                ]
            )
            self._twin = twin
        return self._twin
