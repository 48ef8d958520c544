"""The guarded training loop: one variant, one data set, one seed -> one ``RunResult``.

The loop's parts live beside it, one concept each: the settings (``config``), the forward
contract (``forward``), the compiled step (``step``) and its guard (``guard``), the naming
of a failure (``diagnosis``) and the run's figures (``run_summary``).
"""

from __future__ import annotations

import contextlib
import copy
import time
from collections.abc import Callable, Iterator
from typing import Any

import keras
import numpy as np
import tensorflow as tf

from stability.core.environment import describe
from stability.core.failures import Cause, Failure, Kind, Stage
from stability.core.results import EpochRecord, RunResult
from stability.data import Dataset
from stability.data.graphs import Graph, GraphBatch, batch_graphs, graph_label
from stability.data.padding import Budget, budget_for, pad_batch
from stability.data.prefetch import prefetched
from stability.model.recipe import BuildContext, Recipe, Variant
from stability.train.config import (
    TrainConfig,
    seed_everything,
    storage_dtype,
)
from stability.train.diagnosis import Diagnosis, EpochStart, Rewind
from stability.train.guard import StepReport
from stability.train.probe import probe
from stability.train.run_summary import finish, summarize_epoch
from stability.train.step import fed, input_signature, make_predict, make_train_step
from stability.train.threads import LAYOUT, current, layout_name, require


class Trainer:
    """Trains one variant on one data set and watches every step for the first NaN."""

    def __init__(
        self,
        variant: Variant,
        dataset: Dataset,
        config: TrainConfig,
        on_epoch: Callable[[EpochRecord], None] | None = None,
    ):
        self.variant, self.dataset, self.config, self.on_epoch = variant, dataset, config, on_epoch
        self.recipe: Recipe | None = None

    def build(self) -> Recipe:
        """Clear Keras state, seed everything, and build the variant's recipe."""
        # Without Keras' full gc.collect(): it walks every object the process holds, so its
        # cost grows with the heap (a zoo doctor's driver holds every bug's data and built
        # models), and Python's own collector frees the cycles a dropped model leaves.
        keras.backend.clear_session(free_memory=False)
        seed_everything(self.config.seed)
        ctx = self.context()
        with dtype_policy(self.config.dtype):  # a user's layers without dtype= follow the run's
            recipe = self.variant.build(ctx)
            # Built from the data's shapes and checked before the step reads its weights.
            probe(recipe, self.dataset, self.config.dtype)
            if self.variant.adjust is not None:  # a remedy acting on the built model
                recipe = self.variant.adjust(recipe, ctx)
        # Adam's slots exist before the first compiled step, so tracing never creates them.
        recipe.optimizer.build(recipe.model.trainable_variables)
        self.recipe = recipe
        return recipe

    def context(self) -> BuildContext:
        """What the variant is built from: the data set's shapes and scales, the run's
        settings."""
        return BuildContext(
            num_features=self.dataset.num_features,
            hidden=self.config.hidden,
            num_layers=self.config.num_layers,
            learning_rate=self.config.learning_rate,
            edge_mean=self.dataset.edge_mean,
            edge_std=self.dataset.edge_std,
            dtype=self.config.dtype,
        )

    def run(self) -> RunResult:
        cfg, data = self.config, self.dataset
        if data.nonfinite_input is not None:  # the user's NaN, not training's: do not train
            return input_nan_result(self.variant.name, data, cfg)
        require(cfg.threads, LAYOUT[1])  # before build: its ops would start TensorFlow
        started = time.perf_counter()
        recipe = self.build()
        diagnosis = Diagnosis(recipe, data, cfg)
        dtype = storage_dtype(cfg.dtype)
        signature = input_signature(data.num_features, dtype)
        # Under XLA the step takes padded batches (stability.data.padding); validation never does.
        step_signature = input_signature(data.num_features, dtype, padded=cfg.jit_compile)
        # The first failing step is always guarded, so the weights from before it survive
        # for the replay; with stop_at_nan=False the run then goes on unguarded.
        step = fed(
            make_train_step(recipe, step_signature, guard=True, jit_compile=cfg.jit_compile),
            step_signature,
        )
        predict = fed(make_predict(recipe.model, signature), signature[:1])
        val_batch = batch_graphs(data.val, dtype=dtype)
        result = new_result(self.variant.name, data, cfg)
        # Train on a standardized target; MAE is reported back in the target's own units.
        scaled = (np.array([g.target for g in data.train]) - data.target_mean) / data.target_std
        rng = np.random.default_rng(cfg.seed)
        budget = budget_for(data.train, cfg.batch_size) if cfg.jit_compile else None

        def epoch_batches(rng: np.random.Generator) -> Iterator[tuple[GraphBatch, GraphBatch]]:
            return shuffled_batches(data.train, scaled, cfg.batch_size, rng, dtype, budget)

        steps, step_seconds = 0, 0.0
        for epoch in range(1, cfg.epochs + 1):
            record = EpochRecord(epoch)
            epoch_stats: list[np.ndarray] = []
            tick = time.perf_counter()
            # Where the epoch began, so that an update failure can be replayed from the
            # state just before its step (``Diagnosis.update_site``): a few small copies.
            start = EpochStart(
                [v.numpy() for v in diagnosis.state()], copy.deepcopy(rng.bit_generator.state)
            )
            for batch, ready in prefetched(epoch_batches(rng), cfg.prefetch):
                report = StepReport.of(step(ready.as_inputs(), ready.targets).numpy())
                steps += 1
                start.steps += 1
                if not report.ok and not result.hit_nan:
                    rewind = Rewind(start, step, epoch_batches)
                    diagnosis.step_failure(result, report, epoch, steps, (batch, ready), rewind)
                    if not cfg.stop_at_nan:
                        # Apply the failing update as an unguarded loop would, and go on so.
                        step = fed(
                            make_train_step(
                                recipe, step_signature, guard=False, jit_compile=cfg.jit_compile
                            ),
                            step_signature,
                        )
                        report = StepReport.of(step(ready.as_inputs(), ready.targets).numpy())
                epoch_stats.append(report.stats)
                if not report.passed("loss") and result.loss_nan_epoch is None:
                    result.loss_nan_epoch = epoch
                if result.hit_nan and cfg.stop_at_nan:
                    break
            step_seconds += time.perf_counter() - tick
            summarize_epoch(record, epoch_stats)
            record.val_mae = self._validate(result, diagnosis, predict, val_batch, epoch, steps)
            result.history.append(record)
            if self.on_epoch is not None:
                self.on_epoch(record)
            if result.hit_nan and cfg.stop_at_nan:
                break
        finish(result, cfg, started, steps, step_seconds)
        return result

    def _validate(
        self,
        result: RunResult,
        diagnosis: Diagnosis,
        predict: Callable[..., Any],
        batch: GraphBatch,
        epoch: int,
        steps: int,
    ) -> float:
        """The epoch's validation MAE; a non-finite or unnormalized validation forward pass
        is the run's first failure (stage ``validation``) if it had none before."""
        predictions, healthy = predict(batch.as_inputs())
        mean = predictions.numpy()[:, 0].astype(np.float64)
        if not bool(healthy.numpy()) and not result.hit_nan:
            diagnosis.validation_failure(result, batch, epoch, steps)
        data = self.dataset
        with np.errstate(all="ignore"):
            return float(np.mean(np.abs(mean * data.target_std + data.target_mean - batch.targets)))


@contextlib.contextmanager
def dtype_policy(name: str) -> Iterator[None]:
    """Keras' global dtype policy set to ``name`` inside the block, and restored after it:
    a user's model that leaves its layers' dtype to Keras is built in the run's dtype (the
    built-in model passes ``dtype=ctx.dtype`` to every layer, so it is the same either way)."""
    before = keras.config.dtype_policy()
    keras.config.set_dtype_policy(name)
    try:
        yield
    finally:
        keras.config.set_dtype_policy(before)


def input_nan_result(variant: str, data: Dataset, cfg: TrainConfig) -> RunResult:
    """The row of a run whose data holds NaN or +-Inf: ``first_nan_where = "input"``, the
    graph in ``first_nan_layer`` and the field in ``first_nan_op``; no epoch, no step."""
    index, field = data.nonfinite_input
    result = new_result(variant, data, cfg)
    label = graph_label((data.train + data.val)[index], index)
    result.record_failure(Failure(Stage.INPUT, Kind.INPUT, Cause.INPUT, layer=label, op=field))
    return result


def new_result(variant: str, data: Dataset, cfg: TrainConfig, **fields: Any) -> RunResult:
    """A run's row with its identity and settings filled in; ``fields`` add outcomes."""
    return RunResult(
        case=cfg.case,
        variant=variant,
        seed=cfg.seed,
        dataset=data.key,
        batch_size=cfg.batch_size,
        learning_rate=cfg.learning_rate,
        epochs=cfg.epochs,
        dtype=cfg.dtype,
        tf_version=tf.__version__,
        environment=describe(layout_name(current())),
        **fields,
    )


def shuffled_batches(
    graphs: list[Graph],
    targets: np.ndarray,
    batch_size: int,
    rng: np.random.Generator,
    dtype: str,
    budget: Budget | None = None,
) -> Iterator[tuple[GraphBatch, GraphBatch]]:
    """One epoch of (batch, what the step is fed): the batch itself, or padded to ``budget``.

    The replay of a failing step takes the batch without padding.
    """
    order = rng.permutation(len(graphs))
    for start in range(0, len(order), batch_size):
        chosen = order[start : start + batch_size]
        batch = batch_graphs([graphs[i] for i in chosen], targets=targets[chosen], dtype=dtype)
        yield batch, batch if budget is None else pad_batch(batch, budget)
