"""NanSentinel beside Keras' own callbacks (issue 43, item 6): ``ModelCheckpoint``,
``BackupAndRestore``, ``EarlyStopping(restore_best_weights=True)`` and ``TerminateOnNaN``.

The sentinel wraps the model's optimizer for the length of ``fit``, so these check what the
other callbacks see while it watches and after it stops: checkpoints written mid-fit load
with the user's optimizer, a raised stop keeps the backup (the way keras-team/keras#21771's
``TerminateOnNaN(raise_error=True)`` keeps it: an exception out of ``fit`` skips every
callback's ``on_train_end``, where ``BackupAndRestore`` deletes its backup), and a model
whose ``fit`` ended in an exception trains again afterwards.
"""

import json

import keras
import numpy as np
import pytest
from test_callback import PlantedExp

from stability import NanSentinel

BATCH = 8
#: The batch (0-based, unshuffled) whose inputs make exp(50 x) overflow, and the epochs'
#: length: epochs 1 and 2 (batches 0-5) are healthy, epoch 3 fails at its second step.
BAD_BATCH = 7
STEPS_PER_EPOCH = 3
FAILING_EPOCH, FAILING_STEP = 3, BAD_BATCH + 1
EPOCHS = 6


@pytest.fixture
def late_data():
    """Twelve batches, healthy except batch ``BAD_BATCH``."""
    x = np.random.default_rng(0).normal(scale=0.01, size=(12 * BATCH, 4)).astype("float32")
    x[BAD_BATCH * BATCH : (BAD_BATCH + 1) * BATCH] = 100.0
    return x, x.sum(axis=1, keepdims=True)


def healthy(data):
    """The batches before ``BAD_BATCH``'s epoch: a fit on them never fails."""
    x, y = data
    end = (FAILING_EPOCH - 1) * STEPS_PER_EPOCH * BATCH
    return x[:end], y[:end]


def user_optimizer() -> keras.optimizers.Optimizer:
    """An optimizer whose config differs from Adam's defaults, so a checkpoint's can be told."""
    return keras.optimizers.Adam(learning_rate=3e-3, beta_1=0.8, clipnorm=5.0)


def nan_loss_model() -> keras.Model:
    """Dense -> exp(50 x) -> Dense: the failing batch's exp is inf, and so is its loss or NaN
    (inf times weights of both signs), so ``TerminateOnNaN`` fires at the same step."""
    keras.utils.set_random_seed(0)
    inputs = keras.Input((4,))
    hidden = keras.layers.Dense(8, name="first")(inputs)
    hidden = PlantedExp(name="planted_exp")(hidden)
    model = keras.Model(inputs, keras.layers.Dense(1, name="out")(hidden))
    model.compile(user_optimizer(), "mse")
    return model


def fit(model, data, callbacks, steps_per_epoch=STEPS_PER_EPOCH):
    x, y = data
    return model.fit(
        x,
        y,
        epochs=EPOCHS,
        steps_per_epoch=steps_per_epoch,
        batch_size=BATCH,
        shuffle=False,
        verbose=0,
        callbacks=callbacks,
    )


class WeightLog(keras.callbacks.Callback):
    """The model's weights before each step (by 1-based step of the fit), and at the start
    and end of each epoch (by 0-based epoch)."""

    def __init__(self):
        super().__init__()
        self.step, self.begin, self.end = {}, {}, {}

    def on_train_batch_begin(self, batch, logs=None):
        self.step[len(self.step) + 1] = self.model.get_weights()

    def on_epoch_begin(self, epoch, logs=None):
        self.begin[epoch] = self.model.get_weights()

    def on_epoch_end(self, epoch, logs=None):
        self.end[epoch] = self.model.get_weights()


def same(first, second):
    return len(first) == len(second) and all(
        np.array_equal(a, b) for a, b in zip(first, second, strict=True)
    )


def all_changed(first, second):
    return all(not np.array_equal(a, b) for a, b in zip(first, second, strict=True))


def finite(weights):
    return all(np.isfinite(w).all() for w in weights)


def assert_is_the_users_optimizer(model):
    optimizer = model.optimizer
    assert type(optimizer) is keras.optimizers.Adam, type(optimizer)
    expected = user_optimizer().get_config()
    config = {k: v for k, v in optimizer.get_config().items() if k != "name"}
    assert config == pytest.approx({k: v for k, v in expected.items() if k != "name"}), config
    assert "compute_loss" not in vars(model), "the sentinel's compute_loss was left on the model"


def trains(model, data, callbacks=()):
    """Whether a fit on healthy batches changes every weight and counts its steps."""
    before, iterations = model.get_weights(), int(model.optimizer.iterations.numpy())
    fit(model, healthy(data), list(callbacks))
    steps = int(model.optimizer.iterations.numpy()) - iterations
    return all_changed(before, model.get_weights()) and steps == EPOCHS * STEPS_PER_EPOCH


# --- ModelCheckpoint -----------------------------------------------------------------------


def test_checkpoints_written_while_the_sentinel_watches_load_with_the_users_optimizer(
    late_data, tmp_path
):
    model, log = nan_loss_model(), WeightLog()
    every = keras.callbacks.ModelCheckpoint(tmp_path / "epoch{epoch}.keras")
    best = keras.callbacks.ModelCheckpoint(
        tmp_path / "best.keras", monitor="loss", save_best_only=True
    )
    weights = keras.callbacks.ModelCheckpoint(
        tmp_path / "epoch{epoch}.weights.h5", save_weights_only=True
    )
    sentinel = NanSentinel(verbose=False)
    history = fit(model, late_data, [sentinel, every, best, weights, log])
    assert sentinel.result["first_nan_step"] == FAILING_STEP, sentinel.result
    losses = history.history["loss"]
    assert len(losses) == FAILING_EPOCH and not np.isfinite(losses[-1]), losses

    # Keras ends the failing epoch (on_epoch_end) after a stop, so its checkpoint is written
    # too: it holds the weights and optimizer state from before the failing step.
    for epoch in range(1, FAILING_EPOCH + 1):
        saved = keras.models.load_model(tmp_path / f"epoch{epoch}.keras")
        assert_is_the_users_optimizer(saved)
        assert same(saved.get_weights(), log.end[epoch - 1]), f"epoch {epoch}"
        assert finite(saved.get_weights()), f"epoch {epoch}'s checkpoint included NaNs"
        steps = min(epoch * STEPS_PER_EPOCH, FAILING_STEP - 1)
        assert int(saved.optimizer.iterations.numpy()) == steps, f"epoch {epoch}"

    # save_best_only: a NaN epoch loss is no improvement, so the file is the best healthy one.
    best_epoch = int(np.argmin(losses[: FAILING_EPOCH - 1]))
    assert same(keras.models.load_model(tmp_path / "best.keras").get_weights(), log.end[best_epoch])

    # A weights file written under the wrapper loads into the user's own, unwrapped model.
    last = keras.models.load_model(tmp_path / f"epoch{FAILING_EPOCH}.keras")
    fresh = nan_loss_model()
    fresh.optimizer.build(fresh.trainable_variables)
    fresh.load_weights(tmp_path / f"epoch{FAILING_EPOCH}.weights.h5")
    assert same(fresh.get_weights(), last.get_weights())
    assert same(
        [v.numpy() for v in fresh.optimizer.variables],
        [v.numpy() for v in last.optimizer.variables],
    ), "the optimizer's state did not load from the weights file"


# --- BackupAndRestore ----------------------------------------------------------------------


@pytest.mark.parametrize("watched", [True, False], ids=["resumed-watched", "resumed-unwatched"])
def test_a_raised_stop_keeps_the_backup_and_a_second_fit_resumes_from_it(
    late_data, tmp_path, watched
):
    backup_dir = tmp_path / "backup"
    backup, log = keras.callbacks.BackupAndRestore(backup_dir), WeightLog()
    model = nan_loss_model()
    with pytest.raises(RuntimeError, match=f"step {FAILING_STEP}: "):
        fit(model, late_data, [NanSentinel(raise_error=True), backup, log])
    metadata = json.loads((backup_dir / "training_metadata.json").read_text())
    assert metadata["epoch"] == FAILING_EPOCH - 1, metadata
    assert (backup_dir / "latest.weights.h5").exists()
    assert_is_the_users_optimizer(model)

    resumed = WeightLog()
    callbacks = [backup, resumed] + ([NanSentinel()] if watched else [])
    iterations = int(model.optimizer.iterations.numpy())
    history = fit(model, healthy(late_data), callbacks)
    assert min(resumed.begin) == FAILING_EPOCH - 1, sorted(resumed.begin)
    assert len(history.history["loss"]) == EPOCHS - (FAILING_EPOCH - 1)
    assert same(resumed.begin[FAILING_EPOCH - 1], log.end[FAILING_EPOCH - 2])
    steps = int(model.optimizer.iterations.numpy())
    assert steps == EPOCHS * STEPS_PER_EPOCH, (
        f"optimizer steps: {iterations} before the resumed fit, {steps} after it"
    )
    assert all_changed(resumed.begin[FAILING_EPOCH - 1], model.get_weights()), (
        "the resumed fit did not update the weights"
    )
    assert not backup_dir.exists(), "a fit that completes deletes its backup"


@pytest.mark.parametrize("raise_error", [False, True])
def test_the_backup_is_kept_or_deleted_as_terminate_on_nan_would(late_data, tmp_path, raise_error):
    """Keras deletes the backup at a graceful stop and keeps it at a raised one
    (``TerminateOnNaN(raise_error=True)``, keras-team/keras#21771): the sentinel does the same."""
    kept = {}
    for name, stopper in [
        ("terminate_on_nan", keras.callbacks.TerminateOnNaN(raise_error=raise_error)),
        ("sentinel", NanSentinel(raise_error=raise_error, verbose=False)),
    ]:
        backup_dir = tmp_path / name
        try:
            backup = keras.callbacks.BackupAndRestore(backup_dir)
            fit(nan_loss_model(), late_data, [stopper, backup])
        except RuntimeError:
            assert raise_error, f"{name} raised with raise_error=False"
        kept[name] = backup_dir.exists()
    assert kept == {"terminate_on_nan": raise_error, "sentinel": raise_error}


# --- EarlyStopping -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("steps_per_epoch", "failing_epoch"), [(STEPS_PER_EPOCH, FAILING_EPOCH), (None, 1)]
)
def test_early_stopping_restores_finite_weights_from_before_the_failure(
    late_data, steps_per_epoch, failing_epoch
):
    model, log = nan_loss_model(), WeightLog()
    stopper = keras.callbacks.EarlyStopping(
        monitor="loss", patience=EPOCHS, restore_best_weights=True
    )
    sentinel = NanSentinel(verbose=False)
    history = fit(model, late_data, [sentinel, stopper, log], steps_per_epoch=steps_per_epoch)
    assert sentinel.result["first_nan_epoch"] == failing_epoch, sentinel.result
    assert finite(model.get_weights()), "the restored weights included NaNs"
    losses = history.history["loss"]
    if failing_epoch > 1:  # the best of the healthy epochs
        assert stopper.best_epoch == int(np.argmin(losses[:-1])), losses
        assert same(model.get_weights(), log.end[stopper.best_epoch])
    else:  # no epoch ended healthy: Keras keeps the failing epoch's, the sentinel's kept ones
        assert stopper.best_epoch == 0
        assert same(model.get_weights(), log.step[FAILING_STEP])


# --- TerminateOnNaN ------------------------------------------------------------------------


@pytest.mark.parametrize("sentinel_first", [True, False])
def test_terminate_on_nan_beside_the_sentinel_stops_at_the_same_step(late_data, sentinel_first):
    model, log = nan_loss_model(), WeightLog()
    sentinel = NanSentinel(verbose=False)
    stoppers = [sentinel, keras.callbacks.TerminateOnNaN()]
    history = fit(model, late_data, [*(stoppers if sentinel_first else stoppers[::-1]), log])
    result = sentinel.result
    assert (result["first_nan_epoch"], result["first_nan_step"]) == (FAILING_EPOCH, FAILING_STEP)
    assert result["loss_nan_epoch"] == FAILING_EPOCH, result
    assert len(history.history["loss"]) == FAILING_EPOCH
    # TerminateOnNaN alone lets the failing update through; beside the sentinel it is skipped.
    assert same(model.get_weights(), log.step[FAILING_STEP])
    assert_is_the_users_optimizer(model)
    assert trains(model, late_data)


def test_terminate_on_nan_raising_after_the_sentinel_leaves_the_model_unwatched(late_data):
    """The sentinel stops first, then ``TerminateOnNaN(raise_error=True)`` raises: no
    ``on_train_end`` runs, so the sentinel must have taken its wrappers off when it stopped."""
    model = nan_loss_model()
    sentinel = NanSentinel(verbose=False)
    with pytest.raises(RuntimeError, match="NaN or Inf loss"):
        fit(model, late_data, [sentinel, keras.callbacks.TerminateOnNaN(raise_error=True)])
    assert sentinel.result["first_nan_step"] == FAILING_STEP, sentinel.result
    assert_is_the_users_optimizer(model)
    assert trains(model, late_data), "a later fit did not train the model"


def test_a_new_sentinel_trains_a_model_left_wrapped_by_a_fit_that_raised(late_data):
    """``TerminateOnNaN(raise_error=True)`` listed first raises before the sentinel sees the
    failing step: neither its stop nor its ``on_train_end`` runs, and its wrappers, whose
    guard skips every update after the failure, stay on the model. The next sentinel set on
    the model takes them off."""
    model = nan_loss_model()
    with pytest.raises(RuntimeError, match="NaN or Inf loss"):
        fit(model, late_data, [keras.callbacks.TerminateOnNaN(raise_error=True), NanSentinel()])
    sentinel = NanSentinel(verbose=False)
    assert trains(model, late_data, [sentinel]), "a later watched fit did not train the model"
    assert sentinel.result["first_nan_step"] is None, sentinel.result
    assert_is_the_users_optimizer(model)
