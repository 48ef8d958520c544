"""The tools people use today, on a zoo bug: Keras' ``TerminateOnNaN`` and TensorFlow's
``tf.debugging.enable_check_numerics``, each on ``model.fit`` of the bug's own model.

Each trains the bug's variant as a user would: its model and optimizer built by the
harness's ``Trainer.build`` (seeded, on the case's dtype), compiled with the variant's loss
and fitted on the case's data (``keras_input``: the trainer's batches, the same seed) for
the case's epochs (with no loss scale Keras would add under a mixed policy: the harness
applies none), once with ``TerminateOnNaN`` and once with check_numerics enabled. What
each saw is read the way a user reads it: ``TerminateOnNaN`` stops when the loss it logs
is NaN or Inf, so it sees the loss only (its stage is ``loss``); check_numerics raises at
the first op whose output is NaN or Inf, and its error names the op, read by the harness's
own reader (``train.failing_op.site_from_error``).

Every run is in its own spawned process (check_numerics instruments every graph traced
while it is on, process-wide), one process per bug and tool at a time.
"""

from __future__ import annotations

import math
import statistics
import time
from dataclasses import asdict, dataclass

import keras
import tensorflow as tf

from stability.compat.keras_layers import layer_names
from stability.model.variants import get_variant
from stability.sweep.cases import load_case
from stability.sweep.runner import case_datasets, run_configs
from stability.train.failing_op import site_from_error
from stability.train.keras_input import keras_input
from stability.train.sentinel import NanSentinel
from stability.train.trainer import Trainer

#: The harness's own callback for ``fit`` (``NanSentinel``) times its steps beside them.
TOOLS = ("terminate_on_nan", "check_numerics", "nan_sentinel")


@dataclass(frozen=True)
class ToolRun:
    """What one tool saw on one bug: whether it stopped the training (``detected``), at
    which step (1-based, counted over the whole fit), the stage it points at and the op it
    names (check_numerics, NanSentinel), and the median time of its steps after the first
    (the first traces the step), None with fewer than two steps. ``cause`` is the cause
    ``NanSentinel`` names (None for the other tools, which name none)."""

    tool: str
    detected: bool
    step: int | None
    stage: str | None
    op: str | None
    ms_per_step: float | None
    cause: str | None = None


def tool_run(case_path: str, tool: str) -> dict:
    """Run ``tool`` on the zoo bug whose case file is ``case_path``; a ``ToolRun`` as a dict
    (picklable across processes)."""
    if tool not in TOOLS:
        raise ValueError(f"tool {tool!r}: one of {TOOLS}")
    case = load_case(case_path)
    data = case_datasets(case)[0]
    (variant, config), *_ = run_configs(case)
    recipe = Trainer(get_variant(variant), data, config).build()
    model = recipe.model
    # The bug's own training program, as the harness runs it: under a mixed policy Keras
    # would put a LossScaleOptimizer around the optimizer, which skips the steps whose
    # scaled gradients overflow; the harness's run applies no loss scale (a bug that
    # scales its loss does it by hand, as b_fp16_loss_scaling's reporter did).
    model.compile(optimizer=recipe.optimizer, loss=HarnessLoss(recipe.loss), auto_scale_loss=False)
    steps = StepCounter()
    callbacks = [steps.start]
    # keep_state: an update failure is named op by op, as the harness's run names it.
    sentinel = NanSentinel(verbose=False, keep_state=True) if tool == "nan_sentinel" else None
    if tool == "terminate_on_nan":
        callbacks.append(keras.callbacks.TerminateOnNaN())
    elif sentinel is not None:
        callbacks.append(sentinel)
    callbacks.append(steps)
    batches = keras_input(data, "train", batch_size=config.batch_size, seed=config.seed)
    detected, stage, op, step, cause = False, None, None, None, None
    if tool == "check_numerics":
        tf.debugging.enable_check_numerics()
    try:
        history = model.fit(batches, epochs=config.epochs, verbose=0, callbacks=callbacks)
        losses = history.history.get("loss", [])
        if tool == "terminate_on_nan" and (model.stop_training or not _all_finite(losses)):
            detected, stage, step = True, "loss", steps.count
        if sentinel is not None and sentinel.result.get("first_nan_step") is not None:
            found = sentinel.result
            detected, stage, op = True, found["first_nan_where"], found["first_nan_op"]
            step, cause = found["first_nan_step"], found["failure_cause"]
    except tf.errors.InvalidArgumentError as exc:  # check_numerics found a NaN or Inf
        site = site_from_error(str(exc), layer_names(model), model_name=model.name)
        detected, stage, op, step = True, site.where, site.op, steps.count + 1
    finally:
        if tool == "check_numerics":
            tf.debugging.disable_check_numerics()
    # The steps after the first (which traces the step), and before a detected failure's
    # (whose time holds the tool's diagnosis: the sentinel's replay).
    later = steps.seconds[1 : -1 if detected else None]
    ms = 1e3 * statistics.median(later) if later else None
    return asdict(ToolRun(tool, detected, step, stage, op, ms, cause))


def _all_finite(values: list) -> bool:
    return all(math.isfinite(float(v)) for v in values)


class HarnessLoss(keras.losses.Loss):
    """The variant's loss as a Keras loss: ``loss(targets [num_graphs], predictions)``,
    given the targets as they are (Keras' function-loss wrapper would reshape them to the
    predictions' rank)."""

    def __init__(self, fn):
        super().__init__(name="harness_loss")
        self.fn = fn

    def call(self, y_true, y_pred):
        return self.fn(y_true, y_pred)


class StepCounter(keras.callbacks.Callback):
    """Counts the fit's finished steps and times each, from its batch's start (``start``,
    the first callback) to its end (this one, the last), every other callback's work on the
    step included."""

    def __init__(self):
        super().__init__()
        self.count, self.seconds, self.started = 0, [], 0.0
        self.start = keras.callbacks.LambdaCallback(on_train_batch_begin=self._begin)

    def _begin(self, batch, logs=None):
        self.started = time.perf_counter()

    def on_train_batch_end(self, batch, logs=None):
        self.count += 1
        self.seconds.append(time.perf_counter() - self.started)
