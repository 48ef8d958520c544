"""``NanSentinel``: the harness's failure sentinel as a Keras callback, for any ``Model.fit``.

Keras' ``TerminateOnNaN`` looks at the loss alone. Inside ``tf.function`` a
``Dense(relu)`` fed NaN returns 0, so a model's weights can go NaN while its loss stays
finite, and ``TerminateOnNaN`` never fires. ``NanSentinel`` runs the harness's own step
guard (``guard.guarded_step``, the trainer's sequence) in every training step: the model's
forward tensors (where it exposes them), the attention normalization invariant (where it
exposes its attention weights with their receivers), the loss, the raw gradients (before
the optimizer clips them), and after the update every weight and the optimizer's own
variables (Adam's second moment overflows before any weight does). It keeps the weights
from before a failing update and the failing batch, and names the failure with the
trainer's own naming (``diagnosis.name_failure``): the same stage, layer, op and cause.

Usage::

    sentinel = NanSentinel()
    model.fit(x, y, epochs=100, callbacks=[sentinel])
    print(sentinel.result)  # {"first_nan_epoch": 31, "first_nan_where": "forward", ...}

It is right in every setup ``fit`` trains in (docs/testing.md, "NanSentinel in every Keras
setup"):

- ``steps_per_execution > 1``: the checks run inside the compiled step, the first failing
  step is counted in optimizer steps, and the steps after it in the same execution update
  nothing.
- ``jit_compile=True`` (and ``"auto"``, which Keras resolves to XLA on a GPU): the step
  still runs under XLA, but as a compiled function inside the train step the sentinel
  wraps, which keeps each batch outside XLA (XLA fixes a variable's shape), so the replay
  names the layer and op.
- Mixed precision: Keras' ``LossScaleOptimizer`` skips a step whose *scaled* gradients
  overflow and halves its scale. The sentinel checks the unscaled gradients, lets such a
  skip pass while the scale is above 1, and reports a failure only when the gradients are
  non-finite at a scale of 1 or below, where the scale no longer explains it: the loss
  scale has collapsed, and the failure's step is the first of the skips in a row that led
  there.
- ``tf.distribute`` strategies (``MirroredStrategy``, ``MultiWorkerMirroredStrategy``):
  every replica's step is checked, the replicas agree whether the update may run, and the
  first failure is reported once, with the replica it came from (``result["replica"]``).
"""

from __future__ import annotations

import bisect
import weakref
from collections.abc import Callable
from typing import Any

import keras
import tensorflow as tf

from stability.compat.keras_private import COMPUTE_LOSS_ARGS
from stability.core.failures import Cause, Failure
from stability.core.graph_function import graph_function
from stability.core.results import NAN_FIELDS
from stability.train import guard
from stability.train.checks import all_finite, nonfinite_weight_site, normalization_site
from stability.train.diagnosis import name_failure, replayed_or_named
from stability.train.forward import completed, forward, stats_dtype
from stability.train.guard import REPORT_SIZE, StepReport
from stability.train.guarded_optimizer import GuardedOptimizer
from stability.train.replay import replay_step, xla_gradient_site
from stability.train.site import NanSite
from stability.train.step import apply_update
from stability.train.update_replay import nonfinite_state, replay_update

#: ``first_nan_op`` where the failing batch could not be kept: under XLA with a
#: distribution strategy (the strategy's step is compiled whole, and XLA fixes a resource
#: variable's shape), or on a worker whose replica did not fail.
NOT_REPLAYED = "not named (the failing batch is not kept here)"

#: The loss scale at or below which a non-finite gradient is the gradient's, not the
#: scale's: at 1 the scaled gradients are the true ones. (Keras' ``LossScaleOptimizer``
#: halves its scale without a floor; TensorFlow's old one stopped at 1.)
LOSS_SCALE_FLOOR = 1.0

#: The sentinel whose wrappers each model carries. A fit that raised before its sentinel
#: stopped (``TerminateOnNaN(raise_error=True)`` listed first, KeyboardInterrupt) leaves them
#: on, and after a failure their guard skips every update: the next sentinel set on the
#: model takes them off first.
_WIRED: weakref.WeakKeyDictionary[keras.Model, NanSentinel] = weakref.WeakKeyDictionary()


class NanSentinelError(RuntimeError):
    """Raised by ``NanSentinel(raise_error=True)`` at the first failure (a RuntimeError,
    as Keras' ``TerminateOnNaN(raise_error=True)`` raises)."""


class NanSentinel(keras.callbacks.Callback):
    """Stops ``fit`` at the first numerical failure and names its source.

    For the length of ``fit`` the sentinel puts the model's optimizer behind a
    ``GuardedOptimizer`` (the wrapper pattern of Keras' ``LossScaleOptimizer``), whose
    ``apply`` every Keras ``train_step`` calls with the step's raw gradients: there it runs
    the step guard and applies the update only if every check before it passed, so the
    weights from before the failing step survive for the replay. It reads the step's loss
    and predictions through the model's ``compute_loss``, its attention through
    ``forward`` where the model has one, and keeps each batch from ``train_step``. It
    restores all of them when training ends, so one sentinel can watch several ``fit``
    calls and models, and a new sentinel on the same model sees everything afresh.

    After ``fit``, ``result`` holds the fields of the harness's result row:
    ``first_nan_epoch``, ``first_nan_step`` (counted in optimizer steps from the start of
    that ``fit``), ``first_nan_where``, ``first_nan_layer``, ``first_nan_op``,
    ``loss_nan_epoch``, ``failure_kind`` and ``failure_cause`` (None where nothing
    happened), and ``replica``, the replica the failure came from under a distribution
    strategy (None without one). The failure is named by ``diagnosis.name_failure``, the
    trainer's own naming. An update failure is named from the weights the update wrote (the
    state before the step is gone); its cause comes from the failing step's largest
    |gradient|. ``report`` is the failing step's ``StepReport`` and ``failure`` its
    failure record (``stability.core.failures.Failure``), or None.

    Args:
        replay: replay the failing batch to name the layer and op.
        raise_error: raise ``NanSentinelError`` instead of stopping training gracefully.
        verbose: print one line when training is stopped (as ``TerminateOnNaN`` does).
        keep_state: copy the weights and the optimizer's variables before every update, so
            that an update which writes a non-finite value is replayed op by op from the
            state before it and named as the trainer names it (the op, the slot, the
            weight). Without it (the default: the copy is one assign per variable on every
            healthy step, docs/performance.md) such a failure is named by the weight or
            slot it left non-finite.
    """

    def __init__(
        self,
        replay: bool = True,
        raise_error: bool = False,
        verbose: bool = True,
        keep_state: bool = False,
    ):
        super().__init__()
        self.replay, self.raise_error, self.verbose = replay, raise_error, verbose
        self.keep_state = keep_state
        self._kept_state: list[tf.Variable] | None = None
        self.result: dict[str, Any] = _empty_result()
        self.report: StepReport | None = None
        self.failure: Failure | None = None
        self._stash: list[tf.Variable] | None = None
        self._structure: Any = None
        self._captured: dict[str, Any] = {}
        self._epoch = 0
        self._epoch_steps: list[int] = []  # the step count at each epoch's start
        self._restore: list[tuple[Any, str, Any]] = []
        self._optimizer: keras.optimizers.Optimizer | None = None
        self._jit: Any = False

    # --- wiring ---------------------------------------------------------------------------

    def set_model(self, model: keras.Model) -> None:
        super().set_model(model)
        self._release()
        left = _WIRED.get(model)
        if left is not None:
            left._release()
        self.result, self.report, self.failure = _empty_result(), None, None
        with tf.init_scope():
            self._steps = tf.Variable(0, dtype=tf.int64, trainable=False)
            self._failed_step = tf.Variable(-1, dtype=tf.int64, trainable=False)
            self._failed_replica = tf.Variable(-1, dtype=tf.int32, trainable=False)
            # The first step of the loss scale's current run of skipped steps (-1: none).
            self._skips_from = tf.Variable(-1, dtype=tf.int64, trainable=False)
            # Whether a batch was kept: under a strategy, only the failing replica's worker
            # keeps one.
            self._batch_kept = tf.Variable(False, trainable=False)
            # float64 holds any step's report exactly (a float32 one, or a float64 model's),
            # and the model's weights may not exist yet to say which it will be.
            self._failed_report = tf.Variable(tf.ones([REPORT_SIZE], tf.float64), trainable=False)
        self._stash, self._structure = None, None
        self._exact = bool(getattr(model, "jit_compile", False))
        self._distributed = _distributed(model)
        # Under XLA the batch is kept outside the compiled step (see ``_keeping_step``); a
        # strategy's step is compiled whole, so there it cannot be kept.
        self._keeps_batch = not (self._exact and self._distributed)
        if hasattr(model, "forward"):
            self._patch(model, "forward", self._capturing(model.forward))
        self._patch(model, "compute_loss", self._capturing_loss(model.compute_loss))
        if not self._distributed:
            self._patch(model, "train_step", self._keeping_step(model.train_step, self._exact))
        if getattr(model, "optimizer", None) is not None:  # compiled: fit can train it
            self._optimizer = model.optimizer
            wrapped = GuardedOptimizer(self._optimizer, self._guard_step(model, self._optimizer))
            self._patch(model, "optimizer", wrapped)
            self._rebuild_train_function()
        _WIRED[model] = self

    def _rebuild_train_function(self) -> None:
        """fit() builds its train function only if none is cached: build it afresh, so the
        step that gets traced is the one whose calls are wrapped. Under XLA without a
        strategy the wrapped ``train_step`` compiles the step itself, so the function
        around it is built without XLA for as long as the sentinel watches."""
        model = self.model
        self._jit = model.jit_compile
        if self._exact and not self._distributed:
            model.jit_compile = False
        try:
            model.make_train_function(force=True)
        finally:
            model.jit_compile = self._jit

    def _patch(self, owner: Any, name: str, replacement: Any) -> None:
        had = name in vars(owner)
        self._restore.append((owner, name, vars(owner)[name] if had else None))
        setattr(owner, name, replacement)

    def _unwrap(self) -> None:
        for owner, name, original in reversed(self._restore):
            if original is None:
                vars(owner).pop(name, None)
            else:
                setattr(owner, name, original)
        self._restore = []

    def _release(self) -> None:
        """Take the wrappers off, and drop the train function traced with them: ``fit``
        reuses a cached one, so a later fit would run this sentinel's guard unwatched."""
        models = {id(o): o for o, _, _ in self._restore if isinstance(o, keras.Model)}
        self._unwrap()
        for model in models.values():
            if _WIRED.get(model) is self:
                del _WIRED[model]
            if getattr(model, "optimizer", None) is not None:
                model.make_train_function(force=True)

    def _capturing(self, forward_pass: Any) -> Any:
        """``model.forward`` that also hands its outputs to the step being traced."""

        def captured_forward(*args: Any, **kwargs: Any) -> Any:
            out = forward_pass(*args, **kwargs)
            self._captured = dict(out) if isinstance(out, dict) else {}
            return out

        return captured_forward

    def _capturing_loss(self, compute_loss: Any) -> Any:
        """``model.compute_loss`` that hands the step's batch, predictions and loss to the
        step being traced (under a strategy, the guard keeps the batch from here)."""

        def captured_compute_loss(*args: Any, **kwargs: Any) -> Any:
            # Keras calls compute_loss(x, y, y_pred, sample_weight, ...), positionally.
            named = dict(zip(COMPUTE_LOSS_ARGS, args, strict=False))
            named.update(kwargs)
            loss = compute_loss(*args, **kwargs)
            captured = dict(self._captured)
            if "predictions" not in captured and named.get("y_pred") is not None:
                captured["predictions"] = named["y_pred"]
            captured["_x"], captured["_loss"] = named.get("x"), loss
            captured["_data"] = keras.utils.pack_x_y_sample_weight(
                named.get("x"), named.get("y"), named.get("sample_weight")
            )
            self._captured = captured
            return loss

        return captured_compute_loss

    def _keeping_step(self, train_step: Callable[[Any], Any], xla: bool) -> Callable[[Any], Any]:
        """``model.train_step`` that keeps its batch (for the replay) while no step has
        failed, then runs the step: under XLA as a function compiled with XLA of its own,
        so the batch is kept outside it (XLA fixes a variable's shape, and a batch's shape
        varies), and the step inside is the one ``jit_compile=True`` compiles."""
        step = graph_function(train_step, jit_compile=True, reduce_retracing=True) if xla else None

        def keeping_train_step(data: Any) -> Any:
            tf.cond(self._failed_step < 0, lambda: self._keep(data), tf.no_op)
            return train_step(data) if step is None else step(data)

        return keeping_train_step

    def _guard_step(
        self, model: keras.Model, optimizer: keras.optimizers.Optimizer
    ) -> Callable[[list, list | None, Callable[[list], Any]], None]:
        """The step guard ``GuardedOptimizer`` runs around ``optimizer``'s update."""
        scaled = isinstance(optimizer, keras.optimizers.LossScaleOptimizer)

        def guard_step(grads: list, variables: list | None, update: Callable[[list], Any]) -> None:
            dtype = stats_dtype(model.trainable_variables)
            captured, self._captured = self._captured, {}
            loss = captured.pop("_loss", None)
            x = captured.pop("_x", None)
            data = captured.pop("_data", None)
            raw, skipped = grads, None
            if scaled:
                raw, skipped = self._unscaled(optimizer, grads)
            # Raw gradients, as the step computed them: the optimizer's own clipping
            # (clipnorm, clipvalue) has not run yet, so it cannot hide a NaN.
            checked = guard.Checked(
                completed(captured),
                x,
                tf.constant(0.0) if loss is None else loss,
                raw,
                skipped=skipped,
            )
            weights = model.trainable_variables if variables is None else variables
            if self._distributed:
                self._distributed_step(checked, grads, update, weights, optimizer, dtype, data)
                return
            vector = guard.guarded_step(
                checked,
                lambda: update(grads),
                weights,
                guard.optimizer_state(optimizer),
                exact=self._exact,
                dtype=dtype,
                # Skip a failing update, and every update after it in the same execution:
                # the weights from before the failing step are what the replay needs.
                apply=lambda healthy, run: guard.guarded(
                    healthy & (self._failed_step < 0), self._keeping_state(run, model, optimizer)
                ),
            )
            self._record(vector, tf.constant(0, tf.int32))

        return guard_step

    def _keeping_state(
        self, update: Callable[[], Any], model: keras.Model, optimizer: Any
    ) -> Callable[[], Any]:
        """``update``, after a copy of the state it changes (``keep_state``)."""
        if not self.keep_state or not self.replay:
            return update
        state = _update_state(model, optimizer)
        if self._kept_state is None or len(self._kept_state) != len(state):
            with tf.init_scope():
                self._kept_state = [
                    tf.Variable(tf.zeros(v.shape, v.dtype), trainable=False) for v in state
                ]

        def kept_then_updated() -> Any:
            for copy, variable in zip(self._kept_state, state, strict=True):
                copy.assign(variable)
            return update()

        return kept_then_updated

    def _unscaled(self, optimizer: Any, grads: list) -> tuple[list, tf.Tensor]:
        """The gradients divided by the loss scale, as ``LossScaleOptimizer`` unscales them,
        and whether the optimizer will skip this step for an overflow of the scaled
        gradients that the scale explains (the scale is above ``LOSS_SCALE_FLOOR``)."""
        scale = optimizer.dynamic_scale
        present = [g for g in grads if g is not None]
        overflow = ~all_finite(present)
        if not self._distributed:
            step = self._steps + 1
            # The first step of this run of overflows, kept without a tf.cond (one assign).
            start = tf.where(self._skips_from < 0, step, self._skips_from)
            self._skips_from.assign(tf.where(overflow, start, tf.constant(-1, tf.int64)))
        unscaled = [None if g is None else g / tf.cast(scale, g.dtype) for g in grads]
        return unscaled, overflow & (scale > LOSS_SCALE_FLOOR)

    def _distributed_step(
        self,
        checked: guard.Checked,
        grads: list,
        update: Callable[[list], Any],
        weights: list,
        optimizer: Any,
        dtype: tf.DType,
        data: Any,
    ) -> None:
        """The guard in a replica of a distribution strategy: each replica checks its own
        step, the replicas agree (an all-reduce) whether the update may run, and the update
        runs for every replica or none, from a cross-replica context as Keras'
        ``LossScaleOptimizer`` does (a ``tf.cond`` around the optimizer's ``merge_call``
        cannot be traced in a replica context). Every replica's report is gathered, and
        the first failing replica's is recorded once."""
        context = tf.distribute.get_replica_context()

        def apply(healthy: tf.Tensor, run: Callable[[], Any]) -> None:
            # Summed across replicas (a reduction every strategy has): 0 where all agree.
            vetoes = tf.cast(~(healthy & (self._failed_step < 0)), tf.float32)
            agreed = context.all_reduce(tf.distribute.ReduceOp.SUM, vetoes) < 0.5

            def cross_replica(strategy: Any, agreed: Any, grads: list) -> None:
                def run_everywhere() -> tf.Operation:
                    strategy.extended.call_for_each_replica(update, args=(grads,))
                    return tf.no_op()

                first = strategy.experimental_local_results(agreed)[0]
                tf.cond(first, run_everywhere, tf.no_op)

            context.merge_call(cross_replica, args=(agreed, grads))

        vector = guard.guarded_step(
            checked,
            lambda: None,  # ``apply`` runs the update itself
            weights,
            guard.optimizer_state(optimizer),
            exact=self._exact,
            dtype=dtype,
            apply=apply,
        )
        # [replicas, 14]: every replica's report, in replica order, on every replica.
        vectors = context.all_gather(vector[tf.newaxis], axis=0)
        replica = tf.cast(context.replica_id_in_sync_group, tf.int32)
        leaves = tf.nest.flatten(data) if self._keeps_batch and data is not None else []

        def cross_replica(strategy: Any, vectors: Any, replica: Any, *leaves: Any) -> None:
            everyone = strategy.experimental_local_results(vectors)[0]
            bad = tf.map_fn(guard.failed, everyone, fn_output_signature=tf.bool)
            first_bad = tf.cast(tf.argmax(tf.cast(bad, tf.int32)), tf.int32)
            vector = tf.gather(everyone, first_bad)
            first = (self._failed_step < 0) & tf.reduce_any(bad)
            # The failing replica's batch, where it is one of this worker's replicas.
            ids = strategy.experimental_local_results(replica)
            for index, local in enumerate(ids):
                shard = [strategy.experimental_local_results(leaf)[index] for leaf in leaves]
                if shard:
                    keep = first & tf.equal(local, first_bad)
                    tf.cond(keep, lambda s=shard: self._keep(self._packed(data, s)), tf.no_op)
            self._record(vector, first_bad, failed=first)

        context.merge_call(cross_replica, args=(vectors, replica, *leaves))

    def _packed(self, data: Any, leaves: list) -> Any:
        return tf.nest.pack_sequence_as(data, leaves)

    def _record(
        self, vector: tf.Tensor, replica: tf.Tensor, failed: tf.Tensor | None = None
    ) -> None:
        """Count the step, and mark it when it is the first to fail."""
        self._steps.assign_add(1)
        if failed is None:
            failed = (self._failed_step < 0) & guard.failed(vector)
        tf.cond(failed, lambda: self._mark(vector, replica), tf.no_op)

    def _mark(self, vector: tf.Tensor, replica: tf.Tensor) -> tf.Operation:
        self._failed_step.assign(self._steps)
        self._failed_replica.assign(replica)
        self._failed_report.assign(tf.cast(vector, tf.float64))
        return tf.no_op()

    def _keep(self, data: Any) -> tf.Operation:
        """Copy the batch into variables (made once, shape-free, outside the graph)."""
        leaves = tf.nest.flatten(data)
        if self._stash is None:
            with tf.init_scope():
                self._stash = [
                    tf.Variable(
                        tf.zeros([0] * leaf.shape.rank, leaf.dtype),
                        shape=tf.TensorShape(None),
                        trainable=False,
                    )
                    for leaf in leaves
                ]
            self._structure = data
        for variable, leaf in zip(self._stash, leaves, strict=True):
            variable.assign(leaf)
        self._batch_kept.assign(True)
        return tf.no_op()

    # --- callbacks ------------------------------------------------------------------------

    def on_train_begin(self, logs: dict | None = None) -> None:
        self.result, self.report, self.failure = _empty_result(), None, None
        self._steps.assign(0)
        self._failed_step.assign(-1)
        self._failed_replica.assign(-1)
        self._skips_from.assign(-1)
        self._batch_kept.assign(False)
        self._epoch_steps = []

    def on_train_end(self, logs: dict | None = None) -> None:
        self._release()

    def on_epoch_begin(self, epoch: int, logs: dict | None = None) -> None:
        self._epoch = epoch + 1
        self._epoch_steps.append(int(self._steps.numpy()))

    def on_train_batch_end(self, batch: int, logs: dict | None = None) -> None:
        failed_step = int(self._failed_step.numpy())
        if failed_step < 0 or self.result["first_nan_epoch"] is not None:
            return
        report = StepReport.of(self._failed_report.numpy())
        self.report = report
        step, collapsed = failed_step, False
        if report.first_failure() == "gradient" and self._skips_from.numpy() > 0:
            # The loss scale collapsed: the failure began with the first skip of the run.
            step, collapsed = int(self._skips_from.numpy()), True
        epoch = self._epoch_of(step)
        if not report.passed("loss"):
            self.result["loss_nan_epoch"] = self._epoch_of(failed_step)
        self.failure = name_failure(
            report,
            SentinelReplays(self),
            epoch,
            step,
            self._weights_dtype(),
            no_op_cause=Cause.LOSS_SCALE_COLLAPSE if collapsed else None,
        )
        columns = self.failure.columns()
        self.result.update({name: columns[name] for name in self.result if name in columns})
        if self._distributed:
            self.result["replica"] = int(self._failed_replica.numpy())
        self._stop(step)

    def _epoch_of(self, step: int) -> int:
        """The epoch (from 1) the ``step``-th step of this fit was in."""
        return max(bisect.bisect_left(self._epoch_steps, step), 1)

    def _stop(self, failed_step: int) -> None:
        where = self.failure.stage.value if self.failure else "-"
        replica = self.result.get("replica")
        line = (
            f"NanSentinel: epoch {self.result['first_nan_epoch']}, step {failed_step}"
            f"{'' if replica is None else f', replica {replica}'}: "
            f"{self.result['failure_kind']} ({self.result['failure_cause']}) at {where}"
            f" ({self.result['first_nan_layer'] or '-'}: {self.result['first_nan_op'] or '-'});"
            " training stopped"
        )
        # No step runs after this one, and a callback after this one may raise (as
        # TerminateOnNaN(raise_error=True) does), which skips every on_train_end.
        self._release()
        if self.raise_error:
            raise NanSentinelError(line)
        if self.verbose:
            print(line)
        self.model.stop_training = True

    def _weights_dtype(self) -> str:
        weights = self.model.trainable_variables
        return tf.as_dtype(weights[0].dtype).name if weights else "float32"

    def kept_batch(self) -> tuple[Any, Any, Any] | None:
        """The failing step's batch as ``(x, y, sample_weight)``, or None where none was
        kept (``replay=False``, or see ``NOT_REPLAYED``)."""
        if not self.replay or self._stash is None or not bool(self._batch_kept.numpy()):
            return None
        data = tf.nest.pack_sequence_as(self._structure, [v.value() for v in self._stash])
        return keras.utils.unpack_x_y_sample_weight(data)


class SentinelReplays:
    """``NanSentinel``'s ``diagnosis.Replays``: the kept batch through the model's own
    ``compute_loss``, from the weights the guard kept."""

    transform = None  # fit has no gradient transform: the optimizer clips, after the guard

    def __init__(self, sentinel: NanSentinel):
        self.sentinel, self.model = sentinel, sentinel.model
        self.batch = sentinel.kept_batch()

    def _loss(self) -> Callable[[Any], tf.Tensor]:
        x, y, sample_weight = self.batch
        return lambda y_pred: self.model.compute_loss(
            x=x, y=y, y_pred=y_pred, sample_weight=sample_weight
        )

    def _predict(self, inputs: Any) -> Any:
        return self.model(inputs, training=True)

    def nonfinite(self, stage: str) -> NanSite | None:
        if self.batch is None:
            return NanSite(stage, None, NOT_REPLAYED if self.sentinel.replay else None)
        return in_one_replica(lambda: self._nonfinite(stage))

    def _nonfinite(self, stage: str) -> NanSite | None:
        x = self.batch[0]
        site = replay_step(self.model, self._loss(), x, predict=self._predict)
        if site is None and self.sentinel._exact and stage == "gradient":
            # A gradient that is non-finite under XLA only (XLA rewrites arithmetic).
            site = xla_gradient_site(self.model, self._loss(), x, predict=self._predict)
        return site

    def normalization(self) -> NanSite:
        if self.batch is None:
            return NanSite("forward", None, "softmax normalization")
        return in_one_replica(self._normalization)

    def _normalization(self) -> NanSite:
        # The step's own forward pass, with its training flag, from the kept weights.
        out = forward(self.model, self.batch[0], training=True)
        receivers = out["receivers"]
        site = normalization_site(
            "forward",
            [a.numpy() for a in out["alpha"][: len(receivers)]],
            [r.numpy() for r in receivers],
            out["attention_layers"],
        )
        return site or NanSite("forward", None, "softmax normalization")

    def update(self) -> NanSite:
        optimizer = self.sentinel._optimizer
        inner = getattr(optimizer, "inner_optimizer", optimizer)  # a LossScaleOptimizer's
        named = nonfinite_state_site(self.model.trainable_variables, inner)
        kept = self.sentinel._kept_state
        if kept is None or self.batch is None:
            return named
        site = in_one_replica(lambda: self._replayed_update(optimizer, inner, kept))
        return replayed_or_named(site, named)

    def _replayed_update(self, optimizer: Any, inner: Any, kept: list) -> NanSite | None:
        """The failing update replayed op by op from the state the sentinel copied before
        it, as the trainer replays one (the state after it is put back)."""
        state = _update_state(self.model, optimizer)
        after = [v.numpy() for v in state]
        try:
            for variable, copy in zip(state, kept, strict=True):
                variable.assign(copy)
            # A LossScaleOptimizer's inner optimizer gets the unscaled gradients, which
            # the replay computes from the unscaled loss.
            return replay_update(
                self.model,
                inner,
                self._loss(),
                self.batch[0],
                apply_update,
                predict=self._predict,
            )
        finally:
            for variable, value in zip(state, after, strict=True):
                variable.assign(value)


def in_one_replica(fn: Callable[[], Any]) -> Any:
    """``fn()`` where the model's variables can be read: as it is, or, inside a distribution
    strategy's scope (a cross-replica context, where a mirrored variable's handle is not
    available: ``fit`` runs its callbacks there when it is called in the scope), in the first
    of this worker's replicas (their values are mirrored, so any one will do)."""
    if not (tf.distribute.has_strategy() and tf.distribute.in_cross_replica_context()):
        return fn()
    strategy = tf.distribute.get_strategy()
    first = min(int(r) for r in strategy.experimental_local_results(_replica_ids(strategy)))
    results = []

    def replica_fn() -> None:
        if int(tf.distribute.get_replica_context().replica_id_in_sync_group) == first:
            results.append(fn())

    strategy.run(replica_fn)
    return results[0] if results else None


def _replica_ids(strategy: Any) -> Any:
    """Each of this worker's replicas' id in the sync group, as a per-replica value."""
    return strategy.run(lambda: tf.distribute.get_replica_context().replica_id_in_sync_group)


def nonfinite_state_site(weights: list, optimizer: keras.optimizers.Optimizer) -> NanSite:
    """The site of an update that left a weight, or only the optimizer's state, non-finite:
    the weight's layer, or the first non-finite optimizer variable (e.g. Adam's second
    moment, ``velocity``, of a weight whose ``g * g`` overflowed)."""
    site = nonfinite_weight_site(weights, optimizer)
    stale = nonfinite_state(optimizer) if site.layer is None else None
    return site if stale is None else NanSite("weights", None, f"{site.op}: {stale} not finite")


#: The strategies whose replicas the sentinel agrees across (TensorFlow's default strategy
#: is none of them).
STRATEGIES = (
    tf.distribute.MirroredStrategy,
    tf.distribute.MultiWorkerMirroredStrategy,
    tf.distribute.OneDeviceStrategy,
    tf.distribute.TPUStrategy,
    tf.distribute.experimental.CentralStorageStrategy,
)


def _update_state(model: keras.Model, optimizer: Any) -> list:
    """Every variable an update changes: the model's and the optimizer's (a
    ``LossScaleOptimizer``'s include its inner optimizer's)."""
    return [*model.variables, *optimizer.variables]


def _distributed(model: keras.Model) -> bool:
    """Whether ``model`` trains under a distribution strategy (one it was built in the
    scope of), not TensorFlow's default one."""
    return isinstance(getattr(model, "distribute_strategy", None), STRATEGIES)


def _empty_result() -> dict[str, Any]:
    return {
        **dict.fromkeys(NAN_FIELDS),
        "failure_kind": None,
        "failure_cause": None,
        "replica": None,
    }
