"""The guarded training loop: one variant, one data set, one seed -> one ``RunResult``."""

from __future__ import annotations

import copy
import dataclasses
import inspect
import itertools
import math
import os
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import keras
import numpy as np
import tensorflow as tf

from stability.core.environment import describe
from stability.core.errors import StabilityError
from stability.core.limits import exp_limits
from stability.core.results import EpochRecord, RunResult
from stability.data import Dataset
from stability.data.graphs import Graph, GraphBatch, batch_graphs, graph_label
from stability.data.padding import Budget, budget_for, pad_batch
from stability.data.prefetch import prefetched
from stability.model.variants import BuildContext, Recipe, Variant
from stability.train.cause import failure_cause
from stability.train.checks import (
    CHECKS,
    all_finite,
    as_columns,
    attention_ok,
    finite_given,
    first_failure,
    nonfinite_weight_site,
    normalization_site,
    stage_of,
    step_flags,
)
from stability.train.replay import (
    NanSite,
    replay_forward,
    replay_step,
    replay_update,
    transform_name,
    transformed,
    xla_gradient_site,
)
from stability.train.threads import LAYOUT, current, layout_name, require

#: Dtype policies a run accepts: a float dtype, or Keras' mixed policy (float16 compute,
#: float32 weights), where the naive softmax's exp already overflows above 11.09.
DTYPES = ("float32", "float64", "mixed_float16")


def default_dtype() -> str:
    """The dtype policy of runs that do not name one: ``$STABILITY_DTYPE`` or float32.

    The tox matrix sets the variable to run the whole suite under each policy.
    """
    dtype = os.environ.get("STABILITY_DTYPE", "float32")
    if dtype not in DTYPES:
        raise StabilityError(f"STABILITY_DTYPE={dtype!r} must be one of {', '.join(DTYPES)}")
    return dtype


def storage_dtype(dtype: str) -> str:
    """The dtype of a batch's arrays and of the weights: float32 under a mixed policy."""
    return "float32" if dtype.startswith("mixed_") else dtype


@dataclass(frozen=True)
class TrainConfig:
    """The settings of one run. ``stop_at_nan=False`` trains on past the first NaN, the way
    an unguarded loop would, to see when (or whether) the loss itself turns non-finite."""

    case: str = "adhoc"
    seed: int = 0
    batch_size: int = 32
    learning_rate: float = 3e-2
    epochs: int = 100
    dtype: str = field(default_factory=default_dtype)
    hidden: int = 32
    num_layers: int = 1
    stop_at_nan: bool = True
    #: Compile the step with XLA; batches are then padded to one shape per run
    #: (``stability.data.padding``), since XLA compiles once per shape.
    jit_compile: bool = False
    #: How many batches a host thread builds ahead (``stability.data.prefetch``); 0 builds each
    #: batch when the step needs it. 0 by default: the thread needs a free core, and a
    #: sweep with --workers 2 on 2 cores leaves none (docs/performance.md, "Host-side prefetch").
    prefetch: int = 0
    #: Intra-op threads the run trains on (inter-op: 1). 1 by default, the layout of the
    #: committed reports: another count rounds the sums differently (``stability.train.threads``).
    threads: int = LAYOUT[0]


def seed_everything(seed: int) -> None:
    """Seed Python, NumPy and TensorFlow and make TensorFlow's ops deterministic.

    Without op determinism the same seed gave first NaNs epochs apart (DESIGN.md).
    """
    keras.utils.set_random_seed(seed)
    tf.config.experimental.enable_op_determinism()


def forward(
    model: keras.Model, inputs: dict[str, tf.Tensor], training: bool = True
) -> dict[str, Any]:
    """``model.forward(inputs)`` if the model has it, else its predictions alone.

    ``training`` is passed on to ``forward`` if it takes it, and to ``model(inputs)``: the
    step trains with True, validation predicts with False, and a replay repeats the flag of
    what it replays. The result always has ``predictions``, ``logits``, ``alpha``,
    ``receivers``, ``attention_layers`` and ``softmax_shifted`` (lists may be empty; see
    docs/plugins.md, "The forward contract").
    """
    if hasattr(model, "forward"):
        takes_flag = "training" in inspect.signature(model.forward).parameters
        out = dict(
            model.forward(inputs, training=training) if takes_flag else model.forward(inputs)
        )
    else:
        out = {"predictions": model(inputs, training=training)}
    alphas = list(out.get("alpha") or [])
    out["logits"] = list(out.get("logits") or [])
    out["alpha"] = alphas
    out["receivers"] = list(out.get("receivers") or [])
    names = list(out.get("attention_layers") or [])
    out["attention_layers"] = names + [f"attention_{k}" for k in range(len(names), len(alphas))]
    shifted = list(out.get("softmax_shifted") or [])
    out["softmax_shifted"] = shifted + [False] * (len(out["logits"]) - len(shifted))
    return out


def watched_tensors(out: dict[str, Any]) -> list[tf.Tensor]:
    """The forward tensors whose finiteness is checked: predictions, attention and logits."""
    return [out["predictions"], *out["alpha"], *out["logits"]]


def normalized(out: dict[str, Any], inputs: dict[str, tf.Tensor]) -> tf.Tensor:
    """Scalar bool: the attention of a model that returns its receivers sums to 1 per node."""
    receivers = out["receivers"]
    if not receivers:
        return tf.constant(True)
    return attention_ok(out["alpha"][: len(receivers)], receivers, tf.shape(inputs["nodes"])[0])


def forward_finite(
    out: dict[str, Any], attention: tf.Tensor, max_abs_logit: tf.Tensor, exact: bool = False
) -> tf.Tensor:
    """Scalar bool: predictions, attention weights and logits are all finite.

    Cheap on a healthy step: the logits are read off their max |logit| (``finite_given``),
    and attention weights that sum to 1 at every node are finite (a NaN or inf weight
    makes its node's sum NaN or inf), so they are checked one by one only when the
    normalization check failed, or when the model returns no receivers for them.
    """
    alphas, checked = out["alpha"], len(out["receivers"])
    ok = all_finite([out["predictions"], *alphas[checked:]])
    # Under XLA (``exact``) a max drops NaN: the logits are then checked one by one.
    ok &= finite_given(max_abs_logit, out["logits"], exact=exact)
    if checked:
        ok &= tf.cond(attention, lambda: tf.constant(True), lambda: all_finite(alphas[:checked]))
    return ok


def logit_stats(out: dict[str, Any], inputs: dict[str, tf.Tensor]) -> tf.Tensor:
    """``[3]`` float32: max |attention logit|, the largest ``exp`` argument and the smallest
    per-node max logit.

    The last two are signed: the first is the overflow side (``exp`` is inf above
    log(max)), the second the underflow side (a node whose every logit is below log(tiny)
    has ``exp`` 0 on all its edges). A shifted softmax's ``exp`` sees ``logit - max <= 0``,
    whose largest value at every node is exactly 0, so such a layer counts as 0 on both
    sides. Padding edges of a padded batch are left out. NaN where the model returns no
    logits, and NaN or inf (read as "none" on the host) where it returns no receivers or no
    node has an incoming edge, for the third.
    """
    logits, receivers, shifted = out["logits"], out["receivers"], out["softmax_shifted"]
    mask = inputs.get("edge_mask")
    highs, lows = [], []
    for k, logit in enumerate(logits):
        if shifted[k]:
            highs.append(tf.constant(0.0))
            lows.append(tf.constant(0.0))
            continue
        logit = tf.cast(as_columns(logit), tf.float32)
        lowest = tf.float32.min
        if mask is not None:
            logit = tf.where(mask[:, None], logit, lowest)
        highs.append(tf.reduce_max(logit))
        if k < len(receivers):
            # A node without (real) incoming edges gets float32's lowest: left out below.
            node_max = tf.math.unsorted_segment_max(
                logit, receivers[k], tf.shape(inputs["nodes"])[0]
            )
            # inf where no node has an incoming edge: the host reads it as "none".
            lows.append(tf.reduce_min(tf.where(node_max > lowest, node_max, math.inf)))
    return tf.stack(
        [_max_abs(logits), _extreme(highs, tf.reduce_max), _extreme(lows, tf.reduce_min)]
    )


def _extreme(values: list, reduce: Callable[..., tf.Tensor]) -> tf.Tensor:
    """``reduce`` over scalar ``values``; NaN for none (a single one is used as it is)."""
    if not values:
        return tf.constant(math.nan)
    return values[0] if len(values) == 1 else reduce(tf.stack(values))


def input_signature(
    num_features: int, dtype: str, padded: bool = False
) -> tuple[dict[str, tf.TensorSpec], tf.TensorSpec]:
    """Specs of a ``GraphBatch``'s inputs and targets; every dimension that varies between
    batches is ``None``, so a compiled step is traced once per run, never per batch.
    ``padded`` adds the masks of a padded batch."""
    inputs = {
        "nodes": tf.TensorSpec([None, num_features], dtype),
        "edges": tf.TensorSpec([None, 1], dtype),
        "senders": tf.TensorSpec([None], tf.int32),
        "receivers": tf.TensorSpec([None], tf.int32),
        "node_graph": tf.TensorSpec([None], tf.int32),
        "num_graphs": tf.TensorSpec([], tf.int32),
    }
    if padded:
        inputs["edge_mask"] = tf.TensorSpec([None], tf.bool)
        inputs["graph_mask"] = tf.TensorSpec([None], tf.bool)
    return inputs, tf.TensorSpec([None], dtype)


def make_train_step(
    recipe: Recipe, signature: tuple[Any, Any], guard: bool, jit_compile: bool = False
) -> Callable[..., Any]:
    """A compiled step: forward, loss, gradients, transform, update, and the fused check.

    Returns one ``[14]`` float32 tensor, which ``split_step`` turns into ``flags`` (``[6]``
    bool, one per ``checks.CHECKS``) and ``stats`` (``[8]``, see ``STATS``): one tensor is
    one read back to the host per step, not two. The raw gradients are
    checked before the gradient transform, so a transform that masks a non-finite gradient
    cannot hide it. The ``weights`` check covers the optimizer's own variables too: Adam's
    second moment can overflow to inf while the weights stay finite (``m / inf = 0``), and
    the weights go NaN a step later (``inf - inf``). With ``guard``, a step that fails any
    check before the update leaves the weights as they were, so the last good state
    survives for inspection.
    """
    model, optimizer, weights = recipe.model, recipe.optimizer, recipe.model.trainable_variables
    transform = recipe.gradient_transform
    state = optimizer_state(optimizer)

    @tf.function(input_signature=signature, reduce_retracing=True, jit_compile=jit_compile)
    def step(inputs: dict[str, tf.Tensor], targets: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
        with tf.GradientTape() as tape:
            out = forward(model, inputs, training=True)
            loss = _real_mean(recipe.loss(targets, out["predictions"]), inputs)
            # Regularizers (the weight_constrained variant's l2) join the optimized loss;
            # the reported loss stays the seed's robust loss.
            total = loss + tf.add_n(model.losses) if model.losses else loss
        raw = tape.gradient(total, weights)
        # Norms the statistics report anyway double as the finiteness checks (see
        # checks.finite_given): a healthy step pays no separate pass over the gradients.
        raw_norm = tf.linalg.global_norm(raw)
        if transform is not None:
            gradients = transformed(transform, raw)
            norm = tf.linalg.global_norm(gradients)
            transform_ok = finite_given(norm, gradients)
        else:
            gradients, norm, transform_ok = raw, raw_norm, None
        attention = normalized(out, inputs)
        logit_row = logit_stats(out, inputs)
        before = step_flags(
            forward_finite(out, attention, logit_row[0], exact=jit_compile),
            attention,
            loss,
            finite_given(raw_norm, raw),
            transform_ok,
        )
        if guard:
            tf.cond(tf.reduce_all(before), lambda: _apply(optimizer, gradients, weights), tf.no_op)
        else:
            apply_update(optimizer, gradients, weights)
        max_abs_weight = _max_abs(weights)
        weights_ok = finite_given(max_abs_weight, weights, exact=jit_compile)
        if state:
            weights_ok &= finite_given(_max_abs(state), state, exact=jit_compile)
        flags = tf.cast(tf.concat([before, [weights_ok]], axis=0), tf.float32)
        return tf.concat(
            [
                flags,
                tf.stack(
                    [
                        tf.cast(loss, tf.float32),
                        logit_row[0],
                        tf.cast(norm, tf.float32),
                        max_abs_weight,
                    ]
                ),
                logit_row[1:],
                tf.stack([tf.cast(raw_norm, tf.float32), _max_abs(raw)]),
            ],
            axis=0,
        )

    return step


#: The per-step statistics ``split_step`` returns, in order. ``grad_norm`` is the global
#: norm of the gradients the optimizer gets (after the variant's transform); ``raw_grad_norm``
#: and ``max_abs_grad`` are the backward pass's own.
STATS = (
    "loss",
    "max_abs_logit",
    "grad_norm",
    "max_abs_weight",
    "max_exp_arg",
    "min_node_max_logit",
    "raw_grad_norm",
    "max_abs_grad",
)


def optimizer_state(optimizer: keras.optimizers.Optimizer) -> list:
    """The optimizer's float variables (its slots and learning rate; not its step count)."""
    return [v for v in optimizer.variables if tf.as_dtype(v.dtype).is_floating]


def split_step(report: Any) -> tuple[np.ndarray, np.ndarray]:
    """A step's output (a tensor or array ``[14]``) as ``flags`` ``[6]`` bool and ``stats``
    ``[8]`` float32 (``STATS``; see ``make_train_step``)."""
    report = np.asarray(report)
    return report[: len(CHECKS)] > 0.5, report[len(CHECKS) :]


def apply_update(optimizer: keras.optimizers.Optimizer, gradients: list, weights: list) -> None:
    """``optimizer.apply(gradients, weights)`` in a traced step, without leaking the step.

    In a replica context Keras' TensorFlow optimizer first all-reduces the gradients, and
    TensorFlow wraps that all-reduce in a graph-mode ``tf.custom_gradient``, which registers
    its gradient function in TensorFlow's global gradient registry for good
    (tensorflow/tensorflow#27492, #97697). That function holds the traced step's tensors, so
    every run's step graph stayed alive after ``clear_session()``: about 5.7 MB a run, and
    runs got slower as the heap grew. Inside ``merge_call`` there is no replica context, so
    Keras skips the all-reduce: under the default strategy it is a sum over one replica, and
    the update is the same to the bit.
    """
    context = tf.distribute.get_replica_context()
    if tf.distribute.has_strategy() or context is None:
        # A real strategy's all-reduce sums its replicas' gradients and must stay; in a
        # cross-replica context Keras does not all-reduce anyway.
        optimizer.apply(gradients, weights)
    else:
        context.merge_call(lambda _strategy: optimizer.apply(gradients, weights))


def _apply(optimizer: keras.optimizers.Optimizer, gradients: list, weights: list) -> tf.Operation:
    apply_update(optimizer, gradients, weights)
    return tf.no_op()


def _max_abs(tensors: list) -> tf.Tensor:
    """max |x| over ``tensors``, float32; NaN for none.

    One abs and one max over the tensors flattened into one vector, rather than a pair per
    tensor: the step's cost is mostly its number of small ops (the seed's model has 10
    weights), and this is the reduction the weights check reads (``finite_given``).
    """
    if not tensors:
        return tf.constant(math.nan, tf.float32)
    flat = [tf.reshape(tf.cast(t, tf.float32), [-1]) for t in tensors]
    return tf.reduce_max(tf.abs(flat[0] if len(flat) == 1 else tf.concat(flat, axis=0)))


def make_predict(model: keras.Model, signature: tuple[Any, Any]) -> Callable[..., tf.Tensor]:
    """Validation's compiled forward pass (``training=False``): predictions and ``[1]`` bool,
    whether the forward tensors are finite and the attention is normalized."""

    @tf.function(input_signature=signature[:1], reduce_retracing=True)
    def predict(inputs: dict[str, tf.Tensor]) -> tuple[tf.Tensor, tf.Tensor]:
        out = forward(model, inputs, training=False)
        healthy = all_finite(watched_tensors(out)) & normalized(out, inputs)
        return out["predictions"], healthy

    return predict


#: What a run's first failure was (the ``failure_kind`` column): a non-finite value, the
#: attention weights not summing to 1, a non-finite gradient the gradient transform made
#: finite, or non-finite input data (the run is not trained).
FAILURE_KINDS = ("nonfinite", "normalization", "masked_gradient", "input")

#: A finite run whose ``exp`` arguments came within this fraction of a limit gets a warning
#: (float32: above 79.85 or, for a node's largest logit, below -78.61).
WARNING_MARGIN = 0.1


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
        keras.backend.clear_session()
        seed_everything(self.config.seed)
        ctx = BuildContext(
            num_features=self.dataset.num_features,
            hidden=self.config.hidden,
            num_layers=self.config.num_layers,
            learning_rate=self.config.learning_rate,
            edge_mean=self.dataset.edge_mean,
            edge_std=self.dataset.edge_std,
            dtype=self.config.dtype,
        )
        recipe = self.variant.build(ctx)
        # Adam's slots exist before the first compiled step, so tracing never creates them.
        recipe.optimizer.build(recipe.model.trainable_variables)
        self.recipe = recipe
        return recipe

    def run(self) -> RunResult:
        cfg, data = self.config, self.dataset
        if data.nonfinite_input is not None:  # the user's NaN, not training's: do not train
            return input_nan_result(self.variant.name, data, cfg)
        require(cfg.threads, LAYOUT[1])  # before build: its ops would start TensorFlow
        started = time.perf_counter()
        recipe = self.build()
        signature = input_signature(data.num_features, storage_dtype(cfg.dtype))
        # Under XLA the step takes padded batches (stability.data.padding); validation never does.
        step_signature = input_signature(
            data.num_features, storage_dtype(cfg.dtype), padded=cfg.jit_compile
        )
        # The first failing step is always guarded, so the weights from before it survive
        # for the replay; with stop_at_nan=False the run then goes on unguarded.
        step = make_train_step(recipe, step_signature, guard=True, jit_compile=cfg.jit_compile)
        predict = make_predict(recipe.model, signature)
        val_batch = batch_graphs(data.val, dtype=storage_dtype(cfg.dtype))
        result = new_result(self.variant.name, data, cfg)
        # Train on a standardized target; MAE is reported back in the target's own units.
        scaled = (np.array([g.target for g in data.train]) - data.target_mean) / data.target_std
        rng = np.random.default_rng(cfg.seed)
        budget = budget_for(data.train, cfg.batch_size) if cfg.jit_compile else None
        steps, step_seconds = 0, 0.0
        for epoch in range(1, cfg.epochs + 1):
            record = EpochRecord(epoch)
            epoch_stats: list[np.ndarray] = []
            tick = time.perf_counter()
            # Where the epoch began, so that an update failure can be replayed from the
            # state just before its step (``_update_site``): a few small copies per epoch.
            start = EpochStart(
                [v.numpy() for v in self._state()], copy.deepcopy(rng.bit_generator.state)
            )
            batches = _shuffled_batches(
                data.train, scaled, cfg.batch_size, rng, storage_dtype(cfg.dtype), budget
            )
            for batch, ready in prefetched(batches, cfg.prefetch):
                flags, stats = split_step(step(ready.as_inputs(), ready.targets).numpy())
                steps += 1
                start.steps += 1
                if not flags.all() and not result.hit_nan:
                    rewind = Rewind(start, step, scaled, budget)
                    _record_failing_gradients(result, stats)
                    self._record_first_nan(result, flags, epoch, steps, (batch, ready), rewind)
                    if not cfg.stop_at_nan:
                        # Apply the failing update as an unguarded loop would, and go on so.
                        step = make_train_step(
                            recipe, step_signature, guard=False, jit_compile=cfg.jit_compile
                        )
                        flags, stats = split_step(step(ready.as_inputs(), ready.targets).numpy())
                epoch_stats.append(stats)
                if not flags[CHECKS.index("loss")] and result.loss_nan_epoch is None:
                    result.loss_nan_epoch = epoch
                if result.hit_nan and cfg.stop_at_nan:
                    break
            step_seconds += time.perf_counter() - tick
            _summarize_epoch(record, epoch_stats)
            record.val_mae = self._validate(result, predict, val_batch, epoch, steps)
            result.history.append(record)
            if self.on_epoch is not None:
                self.on_epoch(record)
            if result.hit_nan and cfg.stop_at_nan:
                break
        self._finish(result, started, steps, step_seconds)
        return result

    def _record_first_nan(
        self,
        result: RunResult,
        flags: np.ndarray,
        epoch: int,
        steps: int,
        batches: tuple[GraphBatch, GraphBatch],
        rewind: Rewind | None = None,
    ) -> None:
        """Fill the ``first_nan_*`` fields, ``failure_kind`` and ``failure_cause``; name the
        layer and op.

        ``batches`` is the batch and what the step was fed (the batch padded, under XLA).
        A non-finite value is named by replaying the step with every op checked; a
        normalization failure by recomputing the forward pass (the guard kept the weights);
        an update failure by replaying the update from the state before it (``rewind``).
        """
        recipe = self.recipe
        batch, fed = batches
        result.first_nan_epoch, result.first_nan_step = epoch, steps
        check = first_failure(flags)
        stage = stage_of(check)
        kind = "normalization" if check == "attention" else "nonfinite"
        if check == "weights":  # finite gradients, but the update wrote a non-finite value
            named = nonfinite_weight_site(recipe.model.trainable_variables, recipe.optimizer)
            site = self._update_site(rewind, batch) if rewind is not None else None
            if site is None:
                site = named
            elif site.layer is None:  # the weights the update left non-finite
                site = dataclasses.replace(site, layer=named.layer)
        elif check == "attention":
            site = self._normalization_site("forward", fed, training=True)
        else:
            site = replay_step(
                recipe.model,
                lambda predictions: _total_loss(recipe, batch.targets, predictions),
                _as_tensors(batch.as_inputs()),
                recipe.gradient_transform,
                predict=lambda inputs: forward(recipe.model, inputs, training=True)["predictions"],
            )
        if site is None and self.config.jit_compile and stage == "gradient":
            inputs = _as_tensors(fed.as_inputs())
            site = xla_gradient_site(
                recipe.model,
                lambda predictions: _total_loss(recipe, fed.targets, predictions, inputs),
                inputs,
                recipe.gradient_transform,
                predict=lambda inputs: forward(recipe.model, inputs, training=True)["predictions"],
            )
        # A replay that stayed finite would contradict the check; report what it saw.
        site = site or NanSite(stage)
        if check == "gradient" and flags[CHECKS.index("transform")]:
            # The raw gradient was not finite and the transform made it finite: the run
            # would have trained on as if healthy.
            kind = "masked_gradient"
            name = transform_name(recipe.gradient_transform)
            site = NanSite(
                site.where, site.layer, f"{site.op}; masked by gradient transform {name}"
            )
        result.failure_kind = kind
        result.failure_cause = failure_cause(kind, site, storage_dtype(self.config.dtype))
        if site.grad_norm is not None and math.isfinite(site.grad_norm):
            # The replay's float64 norm: the step's float32 one overflows past ~1e19.
            result.failure_grad_norm = site.grad_norm
        result.first_nan_where, result.first_nan_layer, result.first_nan_op = (
            site.where,
            site.layer,
            site.op,
        )

    def _state(self) -> list:
        """Every variable a step changes: the model's and the optimizer's."""
        return [*self.recipe.model.variables, *self.recipe.optimizer.variables]

    def _update_site(self, rewind: Rewind, batch: GraphBatch) -> NanSite | None:
        """Name the optimizer op that made the update non-finite.

        The guard cannot hold back an update it has not seen yet, so the state from before
        the failing step is rebuilt: back to the epoch's start, then the epoch's earlier
        steps again (op determinism makes them the same to the bit). The failing update is
        then replayed op by op, and the state after the failing step put back.
        """
        recipe, cfg, data = self.recipe, self.config, self.dataset
        state = self._state()
        after = [v.numpy() for v in state]
        try:
            for variable, value in zip(state, rewind.start.values, strict=True):
                variable.assign(value)
            rng = np.random.default_rng()
            rng.bit_generator.state = rewind.start.rng_state
            again = _shuffled_batches(
                data.train,
                rewind.scaled,
                cfg.batch_size,
                rng,
                storage_dtype(cfg.dtype),
                rewind.budget,
            )
            for _, ready in itertools.islice(again, rewind.start.steps - 1):
                rewind.step(ready.as_inputs(), ready.targets)
            return replay_update(
                recipe.model,
                recipe.optimizer,
                lambda predictions: _total_loss(recipe, batch.targets, predictions),
                _as_tensors(batch.as_inputs()),
                apply_update,
                recipe.gradient_transform,
                predict=lambda inputs: forward(recipe.model, inputs, training=True)["predictions"],
            )
        finally:
            for variable, value in zip(state, after, strict=True):
                variable.assign(value)

    def _normalization_site(self, where: str, batch: GraphBatch, training: bool) -> NanSite:
        model = self.recipe.model
        out = forward(model, _as_tensors(batch.as_inputs()), training=training)
        site = normalization_site(
            where,
            [a.numpy() for a in out["alpha"]],
            [r.numpy() for r in out["receivers"]],
            out["attention_layers"],
        )
        return site or NanSite(where, None, "softmax normalization")

    def _validate(
        self,
        result: RunResult,
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
            model = self.recipe.model
            site = replay_forward(
                model,
                lambda inputs: forward(model, inputs, training=False)["predictions"],
                _as_tensors(batch.as_inputs()),
            )
            kind = "nonfinite"
            if site is None:
                site, kind = (
                    self._normalization_site("validation", batch, training=False),
                    ("normalization"),
                )
            result.first_nan_epoch, result.first_nan_step = epoch, steps
            result.failure_kind = kind
            result.failure_cause = failure_cause(
                kind, NanSite("validation", None, site.op, site.evidence)
            )
            result.first_nan_where, result.first_nan_layer, result.first_nan_op = (
                "validation",
                site.layer,
                site.op,
            )
        data = self.dataset
        with np.errstate(all="ignore"):
            return float(np.mean(np.abs(mean * data.target_std + data.target_mean - batch.targets)))

    def _finish(self, result: RunResult, started: float, steps: int, seconds: float) -> None:
        maes = [r.val_mae for r in result.history]
        finite = [m for m in maes if np.isfinite(m)]
        # A run that hit a NaN has no final model a user could keep: final_mae stays empty.
        if not result.hit_nan and maes and np.isfinite(maes[-1]):
            result.final_mae = maes[-1]
        result.best_mae = min(finite) if finite else None
        if result.hit_nan and result.first_nan_epoch > 1:
            before = maes[result.first_nan_epoch - 2]
            result.mae_before_nan = before if np.isfinite(before) else None
        logits = [r.max_abs_logit for r in result.history if np.isfinite(r.max_abs_logit)]
        result.max_abs_logit = max(logits) if logits else None
        highs = [r.max_exp_arg for r in result.history if np.isfinite(r.max_exp_arg)]
        lows = [r.min_node_max_logit for r in result.history if np.isfinite(r.min_node_max_logit)]
        result.max_exp_arg = max(highs) if highs else None
        result.min_node_max_logit = min(lows) if lows else None
        if result.failure_cause is None:
            result.failure_cause = failure_cause(result.failure_kind, None)
        if not result.hit_nan:
            result.warning = headroom_warning(
                result.max_exp_arg, result.min_node_max_logit, self.config
            )
        result.wall_seconds = time.perf_counter() - started
        result.steps_per_second = steps / seconds if seconds > 0 else 0.0


@dataclass
class EpochStart:
    """The state at an epoch's start: every variable's value and the shuffling RNG's state;
    ``steps`` counts the epoch's steps taken so far."""

    values: list[np.ndarray]
    rng_state: dict
    steps: int = 0


@dataclass
class Rewind:
    """What ``Trainer._update_site`` needs to rebuild the state before a failing step: the
    epoch's start, the compiled step, the scaled targets and the padding budget."""

    start: EpochStart
    step: Callable[..., Any]
    scaled: np.ndarray
    budget: Budget | None


def _record_failing_gradients(result: RunResult, stats: np.ndarray) -> None:
    """The failing step's raw gradient norm and max |g|; None where they are not finite."""
    norm, largest = (float(stats[STATS.index(name)]) for name in ("raw_grad_norm", "max_abs_grad"))
    result.failure_grad_norm = norm if math.isfinite(norm) else None
    result.failure_max_abs_grad = largest if math.isfinite(largest) else None


def _real_mean(loss: tf.Tensor, inputs: dict[str, tf.Tensor]) -> tf.Tensor:
    """A batch-mean ``loss`` as the mean over the real graphs of a padded batch.

    The loss is a mean over all graphs, and a padding graph's term is exactly 0 (see
    ``GraphNetwork.forward``), so scaling by all graphs over the real ones gives the real
    graphs' mean. A batch without padding is returned as it is.
    """
    if "graph_mask" not in inputs:
        return loss
    mask = tf.cast(inputs["graph_mask"], loss.dtype)
    return loss * (tf.cast(tf.size(mask), loss.dtype) / tf.reduce_sum(mask))


def _total_loss(
    recipe: Recipe, targets: Any, predictions: tf.Tensor, inputs: dict | None = None
) -> tf.Tensor:
    """The optimized loss: the variant's loss (over the real graphs of padded ``inputs``)
    plus the model's regularization losses."""
    loss = recipe.loss(targets, predictions)
    if inputs is not None:
        loss = _real_mean(loss, inputs)
    return loss + tf.add_n(recipe.model.losses) if recipe.model.losses else loss


def _as_tensors(inputs: dict[str, np.ndarray]) -> dict[str, tf.Tensor]:
    return {name: tf.convert_to_tensor(value) for name, value in inputs.items()}


def input_nan_result(variant: str, data: Dataset, cfg: TrainConfig) -> RunResult:
    """The row of a run whose data holds NaN or +-Inf: ``first_nan_where = "input"``, the
    graph in ``first_nan_layer`` and the field in ``first_nan_op``; no epoch, no step."""
    index, field = data.nonfinite_input
    return new_result(
        variant,
        data,
        cfg,
        first_nan_where="input",
        first_nan_layer=graph_label((data.train + data.val)[index], index),
        first_nan_op=field,
        failure_kind="input",
        failure_cause="input",
    )


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


def _shuffled_batches(
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


def _summarize_epoch(record: EpochRecord, stats: list[np.ndarray]) -> None:
    """Mean loss and gradient norm, max |logit| and |weight|, the largest ``exp`` argument
    and the smallest per-node max logit over the epoch's finite steps."""
    if not stats:
        return
    table = np.array(stats, dtype=np.float64)  # [steps, 8], columns as STATS
    with np.errstate(all="ignore"):
        finite = np.where(np.isfinite(table), table, np.nan)
        if np.isfinite(finite[:, 0]).any():
            record.train_loss = float(np.nanmean(finite[:, 0]))
        for column, name in (
            (1, "max_abs_logit"),
            (3, "max_abs_weight"),
            (4, "max_exp_arg"),
            (7, "max_abs_grad"),
        ):
            if np.isfinite(finite[:, column]).any():
                setattr(record, name, float(np.nanmax(finite[:, column])))
        if np.isfinite(finite[:, 5]).any():
            record.min_node_max_logit = float(np.nanmin(finite[:, 5]))
        if np.isfinite(finite[:, 2]).any():
            record.grad_norm = float(np.nanmean(finite[:, 2]))


def headroom_warning(high: float | None, low: float | None, cfg: TrainConfig) -> str | None:
    """The warning of a run that stayed finite but came near ``exp``'s limits, or None.

    Near: within ``WARNING_MARGIN`` of the dtype's overflow line (``high``, the largest
    ``exp`` argument) or underflow line (``low``, the smallest per-node max logit). Under
    XLA, also above half the overflow line (float32: +44.36), where XLA's softmax gradient
    ``-x / (y * y)`` is finite but wrong (tests/test_xla.py measures it).
    """
    limits = exp_limits(cfg.dtype)
    parts = []
    if high is not None and high > limits.overflow * (1 - WARNING_MARGIN):
        parts.append(
            f"largest exp argument {high:.2f} within {WARNING_MARGIN:.0%} of the "
            f"{cfg.dtype} overflow line {limits.overflow:.2f}"
        )
    elif cfg.jit_compile and high is not None and high > limits.overflow / 2:
        parts.append(
            f"largest exp argument {high:.2f} above {limits.overflow / 2:.2f}, half the "
            f"{cfg.dtype} overflow line: XLA's softmax gradient is finite but wrong there"
        )
    if low is not None and low < -limits.underflow * (1 - WARNING_MARGIN):
        parts.append(
            f"smallest per-node max logit {low:.2f} within {WARNING_MARGIN:.0%} of the "
            f"{cfg.dtype} underflow line {-limits.underflow:.2f}"
        )
    return "; ".join(parts) or None
