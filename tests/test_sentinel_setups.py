"""NanSentinel in every Keras setup (issue 43's matrix): a planted failure and its healthy
twin in ``fit`` under each setup, named as the harness's own trainer names it.

Setups (columns): ``plain`` fit, ``steps_per_execution=5``, ``jit_compile=True``,
``mixed_float16`` (Keras wraps the optimizer in a ``LossScaleOptimizer``) and
``tf.distribute.MirroredStrategy`` on 2 logical CPU devices. Failures (rows), each a small
user-written GNN registered as a variant with its twin (the same model without the plant):

- ``forward``: edge weights ``exp(d)`` (a sign slip for ``exp(-d)``) on a data set one of
  whose molecules gives its distances in picometres: ``exp`` overflows at step 4.
- ``gradient``: a learned radius ``tf.norm(d s)``, whose gradient at a zero vector is NaN
  (tensorflow/tensorflow#12071); every molecule but the first batch's has coincident atoms
  (distance 0), so every step from step 2 on has a NaN gradient and a finite forward pass.
- ``optimizer``: Adam with ``epsilon=0`` on atoms one-hot over 5 elements of which the
  molecules use 3: the embedding rows of the other two get an exactly-zero gradient, and
  Adam's step ``m / (sqrt(v) + 0)`` is ``0 / 0`` at step 1 (stage ``weights``).

The trainer's answer is computed once per plant and dtype (``Trainer.run``, the
``python -m stability run`` path, float32, or ``mixed_float16`` for the mixed column) and
the sentinel's result in each setup must equal it: epoch, step, stage, layer, op, kind and
cause; a twin raises no alarm in either and ends ``fit`` with a finite loss. Each plant is
checked to fail at its own stage in the trainer (the premise of its row); the sentinel is
compared only with the trainer. ``fit`` follows ``stability.zoo.tools``: the
recipe of ``Trainer.build`` compiled with ``HarnessLoss(recipe.loss)`` and fit on
``keras_input`` (the trainer's batches, the same seed), with ``NanSentinel(keep_state=True)``,
the mode that names an update failure op by op as the trainer does.

Why the step agrees in every column: the plants are set by the data, not by the training
trajectory. Under mixed precision the model's output layer computes in float32 (as Keras'
mixed precision guide keeps one), so no healthy step overflows at Keras' initial loss scale
and is skipped; the gradient plant's NaN steps are then skipped one after another until the
scale reaches 1 (15 halvings from 2^15), where the sentinel reports the failure, dated from
the first skip, step 2, as the trainer (which applies no loss scale) dates it.

The XLA column turns op determinism off for its ``compile`` and ``fit``: ``Trainer.build``
turns it on for the process, and Keras then compiles ``jit_compile=True`` without XLA, with
a warning only (``model_supports_jit``); each XLA cell checks that its fit ran with XLA.

One cell is a strict xfail that raises ``OpDisagrees`` only (any other mismatch fails it):
under MirroredStrategy, ``keep_state`` keeps no state, so the optimizer plant's update is
named by the weight it left non-finite, not op by op (``KNOWN`` says where).

MirroredStrategy needs 2 logical CPU devices, which TensorFlow configures only before it
starts (``set_logical_device_configuration`` raises ``RuntimeError`` after), and a pytest
worker has started it for other tests. So the strategy's cells train in one fresh Python
process (``mirrored_main``, started when the module's tests begin, so that it trains on the
other core while this process trains the other columns) that returns JSON; a section that
works only when run alone would pass or fail by test order. Its data is the trainer's
batches split in two halves, one per replica (``replica_halves``).
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import keras
import numpy as np
import pytest
import tensorflow as tf

from stability import BuildContext, NanSentinel, Recipe, TrainConfig, Trainer
from stability.compat.tf_private import disable_op_determinism, op_determinism_enabled
from stability.data import Dataset
from stability.data.graphs import Graph, batch_graphs
from stability.model.recipe import Variant
from stability.train.config import seed_everything
from stability.train.keras_input import keras_input
from stability.train.step import input_signature
from stability.train.trainer import dtype_policy
from stability.zoo.tools import HarnessLoss

pytestmark = pytest.mark.xdist_group("sentinel_setups")  # one worker: one trainer cache

#: The setups ``fit`` trains in: the matrix's columns.
SETUPS = ("plain", "steps_per_execution", "jit_compile", "mixed_float16", "mirrored")
#: The planted failures (the rows), with the stage each is written to fail at.
PLANT_STAGES = {"forward": "forward", "gradient": "gradient", "optimizer": "weights"}

SEED = 0
BATCH = 8
TRAIN_GRAPHS = 88
VAL_GRAPHS = 8
STEPS_PER_EPOCH = math.ceil(TRAIN_GRAPHS / BATCH)  # 11
#: 22 steps: enough for the loss scale's 15 halvings after the gradient plant's step 2.
EPOCHS = 2
REPLICAS = 2
#: The one-hot vocabulary; the molecules use H, C and O only.
VOCABULARY = ("H", "C", "N", "O", "F")
USED = (0, 1, 3)
ATOMS = 4
#: The forward plant's molecule sits here in the first epoch's order: the 3rd graph of step 4,
#: in the first half of its batch (replica 0 under the strategy).
FAR_PLACE = 3 * BATCH + 2
FAR_REPLICA = (FAR_PLACE % BATCH) // (BATCH // REPLICAS)

CONFIG = TrainConfig(
    seed=SEED, batch_size=BATCH, learning_rate=1e-2, epochs=EPOCHS, hidden=8, dtype="float32"
)

#: The result fields compared with the trainer's.
COMPARED = (
    "first_nan_epoch",
    "first_nan_step",
    "first_nan_where",
    "first_nan_layer",
    "first_nan_op",
    "failure_kind",
    "failure_cause",
)
#: The fields that say whether and where a run failed (a twin's are all None).
FIRST_NAN = COMPARED[:-2]

#: How long the strategy's process may train its cells (six when all are selected).
MIRRORED_TIMEOUT = 600.0
#: The line prefix under which ``mirrored_main`` prints its answers.
ANSWERS = "SENTINEL_SETUPS_ANSWERS "
_TESTS = Path(__file__).resolve().parent


# --- the data ------------------------------------------------------------------------------


def molecule(rng: np.random.Generator, *, coincident: bool = False, scale: float = 1.0) -> Graph:
    """``ATOMS`` atoms of H, C and O in a 2.5 A box, an edge each way between every two;
    ``coincident``: every atom at the origin (a molecule without a conformer), so every
    distance is 0; ``scale`` multiplies the distances (100: a file in picometres).

    Every molecule has the same size, so every replica's half batch has the same shapes:
    Keras' fit under a strategy first averages the replicas' first batches
    (``strategy.reduce("MEAN", ...)``), which fails on shapes that differ.
    """
    types = rng.choice(USED, ATOMS)
    pos = np.zeros((ATOMS, 3)) if coincident else rng.uniform(0.0, 2.5, (ATOMS, 3))
    dist = np.linalg.norm(pos[:, None] - pos[None], axis=-1)  # [atoms, atoms]
    senders, receivers = np.nonzero(~np.eye(ATOMS, dtype=bool))
    return Graph(
        nodes=np.eye(len(VOCABULARY))[types],
        edges=scale * dist[senders, receivers][:, None],
        senders=senders.astype(np.int32),
        receivers=receivers.astype(np.int32),
        target=float(dist[senders, receivers].sum() / 2 + (types > 0).sum()),
    )


def first_epoch_order() -> np.ndarray:
    """The training graphs in the order the first epoch draws them: ``keras_input`` and the
    trainer both shuffle each epoch with ``np.random.default_rng(seed).permutation``."""
    return np.random.default_rng(SEED).permutation(TRAIN_GRAPHS)


def dataset(failure: str) -> Dataset:
    """The molecules ``failure``'s plant fails on (its twin trains on the same ones).

    ``forward``: the molecule at ``FAR_PLACE`` of the first epoch gives its distances in
    picometres. ``gradient``: every training molecule but the first batch's has coincident
    atoms. ``optimizer``: the molecules as they are.
    """
    rng = np.random.default_rng(SEED)
    order = first_epoch_order()
    far = order[FAR_PLACE] if failure == "forward" else None
    clean = set(order[:BATCH]) if failure == "gradient" else set(range(TRAIN_GRAPHS))
    train = [
        molecule(rng, coincident=i not in clean, scale=100.0 if i == far else 1.0)
        for i in range(TRAIN_GRAPHS)
    ]
    val = [molecule(rng) for _ in range(VAL_GRAPHS)]
    return Dataset(key=f"sentinel_setups_{failure}(seed={SEED})", train=train, val=val)


# --- the models ----------------------------------------------------------------------------


class DistanceGate(keras.layers.Layer):
    """An edge's weight from its distance: ``exp(-d)``; planted, ``exp(d)`` (a sign slip),
    which overflows above 88.7 in float32 and 11.1 in float16.

    Shapes: ``edges`` ``[num_edges, 1]``; returns ``[num_edges, 1]``.
    """

    def __init__(self, planted: bool, **kwargs: Any):
        super().__init__(**kwargs)
        self.planted = planted

    def call(self, edges: tf.Tensor) -> tf.Tensor:
        return tf.exp(edges if self.planted else -edges)


class LearnedRadius(keras.layers.Layer):
    """An edge's learned radial feature ``|d s|`` (``s`` ``[1, 3]``, learned); planted,
    ``tf.norm``, whose gradient at a zero vector (coincident atoms) is NaN; the twin a safe
    norm, ``sqrt(|d s|^2 + 1e-4)``.

    Shapes: ``edges`` ``[num_edges, 1]``; returns ``[num_edges, 1]``.
    """

    def __init__(self, planted: bool, **kwargs: Any):
        super().__init__(**kwargs)
        self.planted = planted

    def build(self, input_shape: Any) -> None:
        self.scale = self.add_weight(shape=(1, 3), initializer="ones", name="scale")

    def call(self, edges: tf.Tensor) -> tf.Tensor:
        scaled = edges * self.scale  # [num_edges, 3]
        if self.planted:
            return tf.norm(scaled, axis=-1, keepdims=True)
        # eps inside the root: the root's gradient stays finite at a zero vector
        return tf.sqrt(tf.reduce_sum(tf.square(scaled), axis=-1, keepdims=True) + 1e-4)


class SetupsNet(keras.Model):
    """Embed the one-hot atoms, one message pass weighted by ``edge_feature`` of the
    distance (mean over the incoming edges), mean over each molecule, a (mean, log sigma)
    head."""

    def __init__(self, hidden: int, edge_feature: keras.layers.Layer, **kwargs: Any):
        super().__init__(**kwargs)
        self.embed = keras.layers.Dense(hidden, activation="relu", name="embed")
        self.edge_feature = edge_feature
        self.message = keras.layers.Dense(hidden, activation="relu", name="message")
        # Small at the start (log sigma near 0), and float32 under a mixed policy: its
        # kernel's gradient (a sum over the batch) then fits float16 at Keras' initial loss
        # scale, 2^15, and no healthy step is skipped.
        small = keras.initializers.RandomNormal(stddev=0.01)
        self.head = keras.layers.Dense(2, kernel_initializer=small, dtype="float32", name="head")

    def call(self, inputs: dict[str, tf.Tensor]) -> tf.Tensor:
        senders, receivers = inputs["senders"], inputs["receivers"]
        h = self.embed(inputs["nodes"])  # [num_nodes, hidden]
        e = tf.cast(self.edge_feature(inputs["edges"]), h.dtype)  # [num_edges, 1]
        m = self.message(tf.concat([tf.gather(h, senders), e], axis=-1)) * e
        h = h + tf.math.unsorted_segment_mean(m, receivers, tf.shape(h)[0])
        pooled = tf.math.unsorted_segment_mean(h, inputs["node_graph"], inputs["num_graphs"])
        return self.head(pooled)  # [num_graphs, 2]


def _recipe(ctx: BuildContext, edge_feature: keras.layers.Layer, epsilon: float = 1e-7) -> Recipe:
    optimizer = keras.optimizers.Adam(ctx.learning_rate, epsilon=epsilon)
    return Recipe(SetupsNet(ctx.hidden, edge_feature), optimizer)


#: The plants and their twins, by name: test-only variants kept out of the global registry,
#: which other tests in the same process read ("Known: ..." in an unknown variant's error).
VARIANTS: dict[str, Variant] = {}


def _variant(build: Callable[[BuildContext], Recipe]) -> Callable[[BuildContext], Recipe]:
    VARIANTS[build.__name__] = Variant(build.__name__, (build.__doc__ or "").strip(), build)
    return build


@_variant
def sentinel_setups_forward(ctx: BuildContext) -> Recipe:
    """exp(d) edge weights: overflow on the molecule whose distances are in picometres"""
    return _recipe(ctx, DistanceGate(True, name="distance_gate"))


@_variant
def sentinel_setups_forward_twin(ctx: BuildContext) -> Recipe:
    """exp(-d) edge weights: sentinel_setups_forward without its plant"""
    return _recipe(ctx, DistanceGate(False, name="distance_gate"))


@_variant
def sentinel_setups_gradient(ctx: BuildContext) -> Recipe:
    """tf.norm of a learned radius: NaN gradient at coincident atoms"""
    return _recipe(ctx, LearnedRadius(True, name="radius"))


@_variant
def sentinel_setups_gradient_twin(ctx: BuildContext) -> Recipe:
    """a safe norm of a learned radius: sentinel_setups_gradient without its plant"""
    return _recipe(ctx, LearnedRadius(False, name="radius"))


@_variant
def sentinel_setups_optimizer(ctx: BuildContext) -> Recipe:
    """Adam with epsilon 0: 0 / 0 on the embedding rows of unused elements"""
    return _recipe(ctx, DistanceGate(False, name="distance_gate"), epsilon=0.0)


@_variant
def sentinel_setups_optimizer_twin(ctx: BuildContext) -> Recipe:
    """Adam with its default epsilon: sentinel_setups_optimizer without its plant"""
    return _recipe(ctx, DistanceGate(False, name="distance_gate"))


def variant_name(failure: str, planted: bool) -> str:
    """The name of ``failure``'s plant, or of its twin."""
    return f"sentinel_setups_{failure}" + ("" if planted else "_twin")


def config_for(setup: str) -> TrainConfig:
    """The run's settings: the mixed column trains in ``mixed_float16``, the others float32."""
    dtype = "mixed_float16" if setup == "mixed_float16" else "float32"
    return TrainConfig(**{**CONFIG.__dict__, "dtype": dtype})


# --- the trainer's answer ------------------------------------------------------------------


def trainer_answer(failure: str, planted: bool, dtype: str) -> dict[str, Any]:
    """What ``Trainer.run`` reports for the plant (or its twin) in ``dtype``."""
    config = TrainConfig(**{**CONFIG.__dict__, "dtype": dtype})
    result = Trainer(VARIANTS[variant_name(failure, planted)], dataset(failure), config).run()
    return {name: getattr(result, name) for name in COMPARED}


# --- fit under a setup ---------------------------------------------------------------------


def sentinel_answer(
    failure: str, planted: bool, setup: str, strategy: tf.distribute.Strategy | None = None
) -> dict[str, Any]:
    """Fit the plant (or its twin) under ``setup`` with a ``NanSentinel``; its result, the
    fit's epoch losses, and what the setup ran on (optimizer, loss scale, replicas)."""
    data, config = dataset(failure), config_for(setup)
    trainer = Trainer(VARIANTS[variant_name(failure, planted)], data, config)
    xla = without_op_determinism() if setup == "jit_compile" else contextlib.nullcontext()
    with dtype_policy(config.dtype):
        recipe = trainer.build() if strategy is None else build_in(strategy, trainer)
        model = recipe.model
    # The build turned op determinism on (seed_everything); XLA needs it off from here on.
    with dtype_policy(config.dtype), xla:
        with strategy.scope() if strategy is not None else contextlib.nullcontext():
            model.compile(
                optimizer=recipe.optimizer,
                loss=HarnessLoss(recipe.loss),
                steps_per_execution=5 if setup == "steps_per_execution" else 1,
                jit_compile=setup == "jit_compile",
            )
            if strategy is not None:
                build_loss(model, data)
        if strategy is None:
            batches = keras_input(data, "train", batch_size=BATCH, seed=SEED)
            steps = None
        else:
            batches = strategy.distribute_datasets_from_function(lambda _: replica_halves(data))
            steps = STEPS_PER_EPOCH
        sentinel = NanSentinel(verbose=False, keep_state=True)
        history = model.fit(
            batches,
            epochs=EPOCHS,
            steps_per_epoch=steps,
            shuffle=False,  # the batches come shuffled, as the trainer draws them
            verbose=0,
            callbacks=[sentinel],
        )
        jit_compile = model.jit_compile
    optimizer = model.optimizer
    answer = {name: sentinel.result[name] for name in (*COMPARED, "replica")}
    answer.update(
        losses=[float(v) for v in history.history.get("loss", [])],
        optimizer=type(optimizer).__name__,
        loss_scale=float(optimizer.dynamic_scale.numpy())
        if isinstance(optimizer, keras.optimizers.LossScaleOptimizer)
        else None,
        replicas=model.distribute_strategy.num_replicas_in_sync,
        jit_compile=jit_compile,
    )
    return answer


@contextlib.contextmanager
def without_op_determinism() -> Iterator[None]:
    """Op determinism off for the block, and back on after it if it was on. Keras compiles
    with XLA only while it is off (``model_supports_jit``: "not all ops are supported by XLA
    with determinism enabled"; ``jit_compile=True`` becomes False with a warning), and
    ``Trainer.build`` turns it on (``seed_everything``) for the whole process. TensorFlow
    has no public switch to turn it off."""
    was = op_determinism_enabled()
    disable_op_determinism()
    try:
        yield
    finally:
        if was:
            tf.config.experimental.enable_op_determinism()


def build_in(strategy: tf.distribute.Strategy, trainer: Trainer) -> Recipe:
    """``Trainer.build`` with the model's and optimizer's variables made in ``strategy``'s
    scope. ``Trainer.build`` itself cannot run there: its ``clear_session`` empties the graph
    that holds the scope (``IndexError: pop from empty list`` on leaving it), and its probe
    takes a gradient in the cross-replica context (``ValueError: DistributedVariable.handle
    is not available outside the replica context``). So: cleared and seeded as it does,
    then built from the same context and called on the probe's batch, the first 4 training
    graphs (which builds the weights in the same order)."""
    data, config = trainer.dataset, trainer.config
    keras.backend.clear_session()
    seed_everything(config.seed)
    ctx = trainer.context()
    with strategy.scope():
        recipe = trainer.variant.build(ctx)
        recipe.model(first_batch(data)[0])
        recipe.optimizer.build(recipe.model.trainable_variables)
    return recipe


def first_batch(data: Dataset) -> tuple[dict[str, tf.Tensor], tf.Tensor]:
    """The first 4 training graphs as a batch (the probe's), targets at 0."""
    graphs = data.train[:4]
    batch = batch_graphs(graphs, np.zeros(len(graphs)), dtype="float32")
    inputs = {name: tf.constant(value) for name, value in batch.as_inputs().items()}
    return inputs, tf.constant(batch.targets)


def build_loss(model: keras.Model, data: Dataset) -> None:
    """Build the compiled loss on a real batch. Otherwise fit under a strategy builds it
    from the replicas' first batches averaged, which makes the integer indices float (a
    gather then fails: ``Value passed to parameter 'indices' has DataType float32``)."""
    x, y = first_batch(data)
    model.compute_loss(x=x, y=y, y_pred=model(x))


def replica_halves(data: Dataset) -> tf.data.Dataset:
    """Every epoch's batches as the trainer draws them, each split in two halves one after
    the other: ``distribute_datasets_from_function`` hands a worker's elements to its
    replicas in turn, so replica 0 trains on the first half of each batch and replica 1 on
    the second. Each pass starts from the first epoch: under a strategy Keras reads one
    batch before training and then starts again, which would shift a generator that draws
    a new order on every pass (as ``keras_input``'s does) by an epoch."""
    graphs = data.train
    targets = (np.array([g.target for g in graphs]) - data.target_mean) / data.target_std
    half_batch = BATCH // REPLICAS

    def halves() -> Iterator[tuple[dict[str, np.ndarray], np.ndarray]]:
        rng = np.random.default_rng(SEED)
        for _ in range(EPOCHS):
            order = rng.permutation(len(graphs))
            for start in range(0, len(order), half_batch):
                chosen = order[start : start + half_batch]
                batch = batch_graphs([graphs[i] for i in chosen], targets[chosen], dtype="float32")
                yield batch.as_inputs(), batch.targets

    signature = input_signature(data.num_features, "float32")
    return tf.data.Dataset.from_generator(halves, output_signature=signature)


# --- the strategy's process ----------------------------------------------------------------

#: The strategy's cells: every plant and twin.
MIRRORED_CELLS = [(failure, planted) for failure in PLANT_STAGES for planted in (True, False)]


def cell_key(failure: str, planted: bool) -> str:
    return f"{failure}-{'planted' if planted else 'twin'}"


def mirrored_main(keys: list[str] | None = None) -> None:
    """In a fresh process: 2 logical CPU devices, then the strategy cells named by ``keys``
    (``cell_key``; all of them when None), in ``MIRRORED_CELLS``' order, in one
    ``MirroredStrategy``. (A second strategy in the process fails its first all-reduce
    after a model of another size trained under the first, with or without the sentinel:
    "Shape mismatch in the collective instance ... expected shape [149] but another member
    in the group expected shape [146]".) Prints the answers, or each cell's error, as one
    JSON line."""
    from stability.train.threads import pin

    pin()  # the thread layout the trainer's runs train on (tests/conftest.py)
    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(
        cpu, [tf.config.LogicalDeviceConfiguration() for _ in range(REPLICAS)]
    )
    strategy = tf.distribute.MirroredStrategy([f"/cpu:{i}" for i in range(REPLICAS)])
    answers: dict[str, Any] = {}
    for failure, planted in MIRRORED_CELLS:
        if keys is not None and cell_key(failure, planted) not in keys:
            continue  # not selected: no test reads it
        try:
            answers[cell_key(failure, planted)] = sentinel_answer(
                failure, planted, "mirrored", strategy
            )
        except Exception as exc:  # any error: reported by the cell's own test
            answers[cell_key(failure, planted)] = {"error": f"{type(exc).__name__}: {exc}"}
    print(ANSWERS + json.dumps(answers), flush=True)


class MirroredRun:
    """The strategy's process: started once, read once, killed if left running."""

    def __init__(self, log: Path) -> None:
        self.process: subprocess.Popen | None = None
        # A file, not a pipe: the process writes its log while no one reads it yet.
        self.log = log
        self.answers: dict[str, Any] | None = None
        self.problem: str | None = None

    def start(self, keys: list[str] | None = None) -> None:
        """Start the process, training the cells ``keys`` names (all when None)."""
        if self.process is not None:
            return
        boot = (
            f"import sys; sys.path.insert(0, {str(_TESTS)!r}); "
            "import test_sentinel_setups; "
            f"test_sentinel_setups.mirrored_main({keys!r})"
        )
        env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"}
        with self.log.open("w") as log:  # the process keeps its own handle
            self.process = subprocess.Popen(
                [sys.executable, "-c", boot],
                stdout=subprocess.PIPE,
                stderr=log,
                text=True,
                env=env,
            )

    def answer(self, failure: str, planted: bool) -> dict[str, Any]:
        if self.answers is None and self.problem is None:
            self._read()
        if self.problem is not None:
            pytest.fail(self.problem)
        found = self.answers.get(cell_key(failure, planted))
        if found is None:
            pytest.fail(f"the MirroredStrategy process did not train {cell_key(failure, planted)}")
        if "error" in found:
            pytest.fail(f"fit under MirroredStrategy raised: {found['error']}")
        return found

    def _read(self) -> None:
        self.start()
        try:
            out, _ = self.process.communicate(timeout=MIRRORED_TIMEOUT)
        except subprocess.TimeoutExpired:
            self.stop()
            self.problem = f"the MirroredStrategy process ran past {MIRRORED_TIMEOUT:.0f} s"
            return
        lines = [line for line in out.splitlines() if line.startswith(ANSWERS)]
        if self.process.returncode != 0 or not lines:
            tail = "\n".join(self.log.read_text().strip().splitlines()[-25:])
            self.problem = (
                f"the MirroredStrategy process exited {self.process.returncode} "
                f"without answers:\n{tail}"
            )
            return
        self.answers = json.loads(lines[-1][len(ANSWERS) :])

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.communicate()


# --- fixtures ------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def mirrored(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MirroredRun]:
    run = MirroredRun(tmp_path_factory.mktemp("mirrored") / "stderr.log")
    yield run
    run.stop()


@pytest.fixture(scope="module", autouse=True)
def _start_mirrored(request: pytest.FixtureRequest, mirrored: MirroredRun) -> None:
    """Start the strategy's process before the first test, where one of its cells is
    selected: it trains on the other core while this process trains the other columns.
    It trains the selected cells only (the default run deselects two of its twins)."""
    here = request.module.__name__
    keys = [
        cell_key(item.callspec.params["failure"], item.callspec.params["planted"])
        for item in request.session.items
        if item.module.__name__ == here
        and hasattr(item, "callspec")
        and item.callspec.params.get("setup") == "mirrored"
    ]
    if keys:
        mirrored.start(keys)


@pytest.fixture(scope="module")
def trainer_answers() -> dict[tuple[str, bool, str], dict[str, Any]]:
    """The trainer's answer per (failure, planted, dtype), each computed once."""
    return {}


def cached_trainer_answer(
    answers: dict[tuple[str, bool, str], dict[str, Any]], failure: str, planted: bool, dtype: str
) -> dict[str, Any]:
    key = (failure, planted, dtype)
    if key not in answers:
        found = trainer_answer(failure, planted, dtype)
        if planted:  # the premise of the row: the plant fails, at its stage
            assert found["first_nan_where"] == PLANT_STAGES[failure], (
                f"the {failure} plant does not fail at its stage in the trainer ({dtype}): {found}"
            )
        else:
            assert found["first_nan_step"] is None, f"the {failure} twin fails ({dtype}): {found}"
        answers[key] = found
    return answers[key]


# --- the matrix ----------------------------------------------------------------------------


class OpDisagrees(AssertionError):
    """The sentinel names another op than the trainer (every other field agreed)."""


#: The cells that cannot agree yet, and why; the test raises ``OpDisagrees`` there.
KNOWN = {
    ("mirrored", "optimizer"): (
        "under a distribution strategy NanSentinel(keep_state=True) keeps no state: "
        "sentinel.py's _distributed_step runs the update without _keeping_state, so "
        "SentinelReplays.update names it by the weight it left non-finite ('Adam update'), "
        "not op by op as the trainer does"
    ),
}


def _default(setup: str, failure: str) -> bool:
    """Whether the cell runs in the default run. ``steps_per_execution`` changes how steps
    are counted, not how a stage is checked: its forward plant (and
    tests/test_sentinel_keras.py's step counts) show the count; the other stages, checked as
    in the plain setup, run with the slow tests."""
    return setup != "steps_per_execution" or failure == next(iter(PLANT_STAGES))


def cells() -> list[Any]:
    """Every (setup, failure, planted) cell; the strategy's last, so that its process has
    trained on the other core meanwhile. The default run keeps every plant and, per setup,
    the first stage's twin (no false alarm in that setup); the other twins, which train
    the same healthy model again, run with the slow tests (``tox -e slow``), as do the
    gradient and optimizer plants under ``steps_per_execution`` (``_default``)."""
    params = []
    for setup in SETUPS:
        for failure in PLANT_STAGES:
            for planted in (True, False):
                first = failure == next(iter(PLANT_STAGES))
                default = (planted or first) and _default(setup, failure)
                marks = [] if default else [pytest.mark.slow]
                if planted and (setup, failure) in KNOWN:
                    reason = KNOWN[(setup, failure)]
                    marks.append(pytest.mark.xfail(raises=OpDisagrees, strict=True, reason=reason))
                name = f"{setup}-{failure}-{'planted' if planted else 'twin'}"
                params.append(pytest.param(setup, failure, planted, marks=marks, id=name))
    return params


def shown(answer: dict[str, Any]) -> str:
    return json.dumps({k: answer.get(k) for k in (*COMPARED, "replica")}, indent=1)


@pytest.mark.parametrize(("setup", "failure", "planted"), cells())
def test_the_sentinel_in_fit_names_what_the_trainer_names(
    setup: str,
    failure: str,
    planted: bool,
    mirrored: MirroredRun,
    trainer_answers: dict[tuple[str, bool, str], dict[str, Any]],
) -> None:
    if setup == "mirrored":
        found = mirrored.answer(failure, planted)
        assert found["replicas"] == REPLICAS, f"fit ran on {found['replicas']} replicas"
    else:
        found = sentinel_answer(failure, planted, setup)
    if setup == "mixed_float16":
        assert found["optimizer"] == "LossScaleOptimizer", f"fit ran {found['optimizer']}"
    assert found["jit_compile"] is (setup == "jit_compile"), f"jit_compile {found['jit_compile']}"
    expected = cached_trainer_answer(trainer_answers, failure, planted, config_for(setup).dtype)

    if not planted:
        assert found["first_nan_step"] is None, f"{setup}: an alarm on the twin:\n{shown(found)}"
        assert {k: found[k] for k in FIRST_NAN} == {k: expected[k] for k in FIRST_NAN}
        losses = found["losses"]
        assert len(losses) == EPOCHS and math.isfinite(losses[-1]), f"{setup}: losses {losses}"
        return

    context = f"{setup}, {failure} plant\nsentinel: {shown(found)}\ntrainer: {shown(expected)}"
    assert found["first_nan_step"] is not None, f"no failure found\n{context}"
    others = [k for k in COMPARED if k != "first_nan_op"]
    assert {k: found[k] for k in others} == {k: expected[k] for k in others}, context
    if found["first_nan_op"] != expected["first_nan_op"]:
        raise OpDisagrees(context)
    if setup == "mirrored":
        # The failing replica: the one whose half holds the far molecule; elsewhere both
        # halves fail alike, and the first replica is the one named.
        assert found["replica"] == (FAR_REPLICA if failure == "forward" else 0), context
    else:
        assert found["replica"] is None, context
    if setup == "mixed_float16" and failure == "gradient":
        # The path under test: the NaN steps were skipped until the scale collapsed to 1.
        assert found["loss_scale"] <= 1.0, f"loss scale {found['loss_scale']}\n{context}"
