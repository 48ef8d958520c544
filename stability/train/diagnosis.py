"""Naming a run's first failure: which check fired, where, and why (``failure_cause``).

The step guard says which check failed; the diagnosis replays what it needs to name the
layer and op: the failing step with every op checked (a non-finite value), the forward pass
from the weights the guard kept (a normalization failure), or the update from the state just
before the failing step (``Rewind``; an update failure, which the guard cannot hold back).
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
import tensorflow as tf

from stability.core.failures import Cause, Failure, Kind, Stage
from stability.core.results import RunResult
from stability.data import Dataset
from stability.data.graphs import GraphBatch
from stability.model.recipe import Recipe
from stability.train.cause import failure_cause
from stability.train.checks import nonfinite_weight_site, normalization_site
from stability.train.config import TrainConfig, storage_dtype
from stability.train.forward import forward
from stability.train.guard import StepReport, stage_of
from stability.train.replay import replay_forward, replay_step, xla_gradient_site
from stability.train.site import NanSite
from stability.train.step import apply_update, total_loss
from stability.train.tape import transform_name
from stability.train.update_replay import replay_update


@dataclass
class EpochStart:
    """The state at an epoch's start: every variable's value and the shuffling RNG's state;
    ``steps`` counts the epoch's steps taken so far."""

    values: list[np.ndarray]
    rng_state: dict
    steps: int = 0


@dataclass
class Rewind:
    """What ``Diagnosis.update_site`` needs to rebuild the state before a failing step: the
    epoch's start, the compiled step and the epoch's batches again (``batches(rng)``, the
    trainer's shuffling from that RNG state)."""

    start: EpochStart
    step: Callable[..., Any]
    batches: Callable[[np.random.Generator], Iterator[tuple[GraphBatch, GraphBatch]]]


class Diagnosis:
    """Fills a run's ``first_nan_*``, ``failure_kind`` and ``failure_cause`` fields."""

    def __init__(self, recipe: Recipe, dataset: Dataset, config: TrainConfig):
        self.recipe, self.dataset, self.config = recipe, dataset, config

    def step_failure(
        self,
        result: RunResult,
        report: StepReport,
        epoch: int,
        steps: int,
        batches: tuple[GraphBatch, GraphBatch],
        rewind: Rewind | None = None,
    ) -> None:
        """Name the first failing step's failure (``name_failure``) and record it.

        ``batches`` is the batch and what the step was fed (the batch padded, under XLA).
        A non-finite value is named by replaying the step with every op checked; a
        normalization failure by recomputing the forward pass (the guard kept the weights);
        an update failure by replaying the update from the state before it (``rewind``).
        """
        batch, fed = batches
        replays = TrainerReplays(self, batch, fed, rewind)
        dtype = storage_dtype(self.config.dtype)
        result.record_failure(name_failure(report, replays, epoch, steps, dtype))

    def _weights_site(self, rewind: Rewind | None, batch: GraphBatch) -> NanSite:
        recipe = self.recipe
        named = nonfinite_weight_site(recipe.model.trainable_variables, recipe.optimizer)
        replayed = self.update_site(rewind, batch) if rewind is not None else None
        return replayed_or_named(replayed, named)

    def _replayed_site(self, batch: GraphBatch, fed: GraphBatch, stage: str) -> NanSite | None:
        recipe = self.recipe
        site = replay_step(
            recipe.model,
            lambda predictions: total_loss(recipe, batch.targets, predictions),
            as_tensors(batch.as_inputs()),
            recipe.gradient_transform,
            predict=self._predict,
        )
        if site is None and self.config.jit_compile and stage == "gradient":
            inputs = as_tensors(fed.as_inputs())
            site = xla_gradient_site(
                recipe.model,
                lambda predictions: total_loss(recipe, fed.targets, predictions, inputs),
                inputs,
                recipe.gradient_transform,
                predict=self._predict,
            )
        return site

    def _predict(self, inputs: dict[str, tf.Tensor]) -> tf.Tensor:
        """The step's own call of the model, for a replay (training=True)."""
        return forward(self.recipe.model, inputs, training=True)["predictions"]

    def state(self) -> list:
        """Every variable a step changes: the model's and the optimizer's."""
        return [*self.recipe.model.variables, *self.recipe.optimizer.variables]

    def update_site(self, rewind: Rewind, batch: GraphBatch) -> NanSite | None:
        """Name the optimizer op that made the update non-finite.

        The guard cannot hold back an update it has not seen yet, so the state from before
        the failing step is rebuilt: back to the epoch's start, then the epoch's earlier
        steps again (op determinism makes them the same to the bit). The failing update is
        then replayed op by op, and the state after the failing step put back.
        """
        recipe = self.recipe
        state = self.state()
        after = [v.numpy() for v in state]
        try:
            for variable, value in zip(state, rewind.start.values, strict=True):
                variable.assign(value)
            rng = np.random.default_rng()
            rng.bit_generator.state = rewind.start.rng_state
            for _, ready in itertools.islice(rewind.batches(rng), rewind.start.steps - 1):
                rewind.step(ready.as_inputs(), ready.targets)
            return replay_update(
                recipe.model,
                recipe.optimizer,
                lambda predictions: total_loss(recipe, batch.targets, predictions),
                as_tensors(batch.as_inputs()),
                apply_update,
                recipe.gradient_transform,
                predict=self._predict,
            )
        finally:
            for variable, value in zip(state, after, strict=True):
                variable.assign(value)

    def normalization_site(self, where: str, batch: GraphBatch, training: bool) -> NanSite:
        """The layer whose attention does not sum to 1, recomputed from the kept weights."""
        out = forward(self.recipe.model, as_tensors(batch.as_inputs()), training=training)
        site = normalization_site(
            where,
            [a.numpy() for a in out["alpha"]],
            [r.numpy() for r in out["receivers"]],
            out["attention_layers"],
        )
        return site or NanSite(where, None, "softmax normalization")

    def validation_failure(
        self, result: RunResult, batch: GraphBatch, epoch: int, steps: int
    ) -> None:
        """Name a non-finite or unnormalized validation forward pass (stage ``validation``)."""
        model = self.recipe.model
        site = replay_forward(
            model,
            lambda inputs: forward(model, inputs, training=False)["predictions"],
            as_tensors(batch.as_inputs()),
        )
        kind = Kind.NONFINITE
        if site is None:
            site = self.normalization_site("validation", batch, training=False)
            kind = Kind.NORMALIZATION
        cause = failure_cause(kind.value, NanSite("validation", None, site.op, site.evidence))
        failure = Failure(Stage.VALIDATION, kind, cause, epoch, steps, site.layer, site.op)
        result.record_failure(failure)


class Replays(Protocol):
    """What naming a failed check needs from whoever ran the step (the trainer's
    ``TrainerReplays``, ``NanSentinel``'s own): each replays from the weights the guard kept."""

    #: The variant's gradient transform (None: none), for a masked gradient.
    transform: Callable[[list], list] | None

    def nonfinite(self, stage: str) -> NanSite | None:
        """The step replayed with every op checked: the first non-finite op, or None."""

    def normalization(self) -> NanSite:
        """The forward pass recomputed: the first layer whose attention does not sum to 1."""

    def update(self) -> NanSite:
        """The update that left a weight or the optimizer's state non-finite."""


def name_failure(
    report: StepReport,
    replays: Replays,
    epoch: int,
    step: int,
    gradient_dtype: str,
    no_op_cause: Cause | None = None,
) -> Failure:
    """The one naming of a failed check, for the trainer and ``NanSentinel`` alike: its
    stage, kind, site (by the replay ``replays`` gives), the tf.where rule, a masked
    gradient, and the cause (``failure_cause``).

    ``no_op_cause`` is the cause when the replay names no op (a loss scale that collapsed
    with no non-finite op at scale 1: ``Cause.LOSS_SCALE_COLLAPSE``).
    """
    check = report.first_failure()
    stage = stage_of(check)
    kind = Kind.NORMALIZATION if check == "attention" else Kind.NONFINITE
    if check == "weights":  # finite gradients, but the update wrote a non-finite value
        site = replays.update()
    elif check == "attention":
        site = replays.normalization()
    else:
        site = replays.nonfinite(stage)
    # A replay that stayed finite would contradict the check; report what it saw.
    replayed = site is not None
    site = site or NanSite(stage)
    if stage == "gradient" and site.selected:
        # The guard saw every forward tensor and the loss finite, and the non-finite
        # value the replay met there reaches a tf.where that discarded it (the
        # unused branch, tensorflow/tensorflow#38349): it reaches only the gradient,
        # so the failure is the gradient's, through that op. A value hidden some
        # other way (a relu or max that drops NaN on some CPUs) stays the forward
        # pass's failure, whatever the CPU.
        site = dataclasses.replace(
            site,
            where="gradient",
            op=f"{site.op}, discarded in the forward pass, non-finite in its gradient",
            evidence=None,
        )
    if check == "gradient" and report.passed("transform"):
        # The raw gradient was not finite and the transform made it finite: the run
        # would have trained on as if healthy.
        kind = Kind.MASKED_GRADIENT
        name = transform_name(replays.transform)
        site = NanSite(site.where, site.layer, f"{site.op}; masked by gradient transform {name}")
    largest = report.stat("max_abs_grad")
    cause = failure_cause(
        kind.value, site, gradient_dtype, largest if math.isfinite(largest) else None
    )
    if not replayed and no_op_cause is not None:
        cause = no_op_cause
    return failure_of(site, kind, cause, epoch, step, report)


class TrainerReplays:
    """The trainer's ``Replays``: the failing batch and what the step was fed, and the
    epoch's ``Rewind`` for an update failure."""

    def __init__(
        self, diagnosis: Diagnosis, batch: GraphBatch, fed: GraphBatch, rewind: Rewind | None
    ):
        self.diagnosis, self.batch, self.fed, self.rewind = diagnosis, batch, fed, rewind
        self.transform = diagnosis.recipe.gradient_transform

    def nonfinite(self, stage: str) -> NanSite | None:
        return self.diagnosis._replayed_site(self.batch, self.fed, stage)

    def normalization(self) -> NanSite:
        return self.diagnosis.normalization_site("forward", self.fed, training=True)

    def update(self) -> NanSite:
        return self.diagnosis._weights_site(self.rewind, self.batch)


def replayed_or_named(replayed: NanSite | None, named: NanSite) -> NanSite:
    """An update failure's site: the update's replay where it named the op (with the layer
    of the weights the update left non-finite where the replay named none), else ``named``,
    the site read off those weights."""
    if replayed is None:
        return named
    if replayed.layer is None:
        return dataclasses.replace(replayed, layer=named.layer)
    return replayed


def failure_of(
    site: NanSite, kind: Kind, cause: Cause, epoch: int, step: int, report: StepReport
) -> Failure:
    """The failure record of a failing training step: where ``site`` found it and the
    step's gradient figures (the replay's float64 norm where it has one: the step's float32
    norm overflows past ~1e19)."""
    norm, largest = report.stat("raw_grad_norm"), report.stat("max_abs_grad")
    if site.grad_norm is not None and math.isfinite(site.grad_norm):
        norm = site.grad_norm
    return Failure(
        stage=Stage(site.where),
        kind=kind,
        cause=cause,
        epoch=epoch,
        step=step,
        layer=site.layer,
        op=site.op,
        slot=site.slot,
        weight=site.weight,
        weight_max_abs_grad=site.max_abs_grad,
        grad_norm=norm if math.isfinite(norm) else None,
        max_abs_grad=largest if math.isfinite(largest) else None,
    )


def as_tensors(inputs: dict[str, np.ndarray]) -> dict[str, tf.Tensor]:
    return {name: tf.convert_to_tensor(value) for name, value in inputs.items()}
