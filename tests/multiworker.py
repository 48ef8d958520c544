"""Run a function in 2 worker processes under ``tf.distribute.MultiWorkerMirroredStrategy``.

A test helper: ``run_workers("test_multiworker:fit_dense", {"epochs": 2})`` starts two fresh
Python processes that form a 2-worker cluster on this machine, calls the target in each with
the worker's strategy, and returns what each returned, in worker order::

    def fit_dense(strategy, epochs):  # in a module on tests/'s path
        model = Model([keras.layers.Dense(1)])  # class Model(ReducibleLogs, keras.Sequential)
        with strategy.scope():
            model.build((None, 4))
            model.compile(optimizer="adam", loss="mse")
            model.optimizer.build(model.trainable_variables)
            history = model.fit(dataset, epochs=epochs)
        return {"loss": history.history["loss"]}  # anything json.dumps takes

Loopback only, in a network namespace of its own. TensorFlow's gRPC server listens on every
address whatever the cluster spec names: ``GrpcServer::Init`` asks for ``0.0.0.0:<port>``,
which gRPC takes as the wildcard of both families (a worker's /proc/net/tcp6 shows it listening
on ``[::]:<port>``), and no public API changes it. So the workers never run in this machine's
network namespace: ``run_workers`` starts a supervisor under ``unshare --net --map-root-user``
(a new network namespace, in a new user namespace so that no root is needed), which checks that
its namespace is not the caller's and holds no interface but ``lo``, brings ``lo`` up, picks
two free ports on 127.0.0.1 and starts the workers there, with ``127.0.0.1:<port>`` in
``TF_CONFIG``. A wildcard socket in that namespace reaches 127.0.0.1 and ::1 of that namespace
and nothing else, not even the host's loopback. Where no namespace can be made, ``run_workers``
raises rather than start a server on the host's addresses (``isolation_problem`` says why; the
tests skip then).

Each worker, in this order: sets TensorFlow's intra- and inter-op pools to 1 thread (possible
only before its context starts), builds the strategy (``MultiWorkerMirroredStrategy`` must
configure the collective ops before the process's first TensorFlow op: after one it raises
``RuntimeError: Collective ops must be configured at program startup``), imports Keras, seeds
with ``keras.utils.set_random_seed`` and only then imports the target's module, so that a
module which runs TensorFlow ops on import runs them after the strategy exists.

Keras 3.15's ``fit`` under this strategy with 2 workers needs two things of the model
(keras-team/keras#20585, open); each failure below is what a stock model raises:

- Create the model object outside ``strategy.scope()`` and build it, compile it, build its
  optimizer (``model.optimizer.build(model.trainable_variables)``) and call ``fit`` inside it.
  A model created in the scope keeps the strategy, and ``fit`` then reduces its first batch
  across workers with one ``strategy.reduce`` of the whole ``(x, y)`` structure, which the
  multi-worker strategy cannot do: ``ValueError: Attempt to convert a value (PerReplica:{...})
  with an unsupported type (<class '...values.PerReplica'>) to a Tensor``. A model created
  outside skips that step and takes the strategy from the scope ``fit`` runs in; its
  variables, built in the scope, are mirrored all the same.
- Give the step's logs a leading axis (``ReducibleLogs``): ``fit`` reduces each log across
  workers with ``strategy.reduce("MEAN", value, axis=0)``, and a step's logs are scalars:
  ``ValueError: Invalid reduction dimension 0 for input with 0 dimensions``.

Failures: a worker that raises writes its error and exits at once (``os._exit``): a normal
exit would wait in the coordination service's shutdown barrier for a peer that may be stuck in
a collective. The supervisor polls both workers, kills the other as soon as one fails, and
kills both at ``timeout``; ``run_workers`` then raises ``WorkerError`` naming the worker,
its exception and each worker's stderr tail. Its own wait on the supervisor is ``timeout``
plus a grace, after which it kills the supervisor's whole process group.
"""

from __future__ import annotations

import contextlib
import fcntl
import importlib
import json
import os
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

#: Workers in the cluster.
WORKERS = 2

#: The one address the workers are given (TF_CONFIG) and the ports are picked on.
HOST = "127.0.0.1"

#: Seconds ``run_workers`` waits beyond ``timeout`` for the supervisor to kill its workers
#: and report, before it kills the supervisor's process group itself.
GRACE = 20.0

#: Lines of each worker's stderr a ``WorkerError`` quotes.
TAIL_LINES = 25

_TESTS = Path(__file__).resolve().parent

#: What a fresh process runs: this module imported with tests/ on its path (the targets'
#: modules are found the same way), then ``_main`` with the command's arguments.
_BOOT = (
    f"import sys; sys.path.insert(0, {str(_TESTS)!r}); import multiworker; "
    "multiworker._main(sys.argv[1:])"
)

_UNSHARE = ("unshare", "--net", "--map-root-user", "--")

# Linux's interface ioctls (<linux/sockios.h>, <net/if.h>): struct ifreq is a 16-byte name
# and a 24-byte union whose first member, for these two, is the short flags.
_SIOCGIFFLAGS = 0x8913
_SIOCSIFFLAGS = 0x8914
_IFF_UP = 0x1
_IFREQ = "16sH22x"


class WorkerError(RuntimeError):
    """A worker raised, died or timed out; the message names it and quotes stderr tails.

    ``failed`` holds the indices of the workers that failed on their own (not the ones the
    supervisor killed after), first failure first; ``timed_out`` says whether the pair ran
    past its timeout.
    """

    def __init__(self, message: str, failed: list[int], timed_out: bool) -> None:
        super().__init__(message)
        self.failed = failed
        self.timed_out = timed_out


class ReducibleLogs:
    """Mixin for a ``keras.Model`` that ``fit`` or ``evaluate`` runs on 2 or more workers:
    each log of a step gets a leading axis of 1.

    ``class Model(ReducibleLogs, keras.Sequential)``. Keras reduces each log of a step across
    workers along axis 0 (``strategy.reduce("MEAN", value, axis=0)``); with the axis the
    result is the mean over all replicas, a scalar again, as ``fit`` reports it without one.
    """

    def train_step(self, data: Any) -> dict[str, Any]:
        from keras import ops

        # [1] per log, the axis the cross-worker reduction takes away again.
        return {name: ops.reshape(value, (1,)) for name, value in super().train_step(data).items()}

    def test_step(self, data: Any) -> dict[str, Any]:
        from keras import ops

        return {name: ops.reshape(value, (1,)) for name, value in super().test_step(data).items()}


def isolation_problem() -> str | None:
    """Why ``run_workers`` cannot run here (no ``unshare``, or it may not make a network
    namespace), or None when it can."""
    if shutil.which(_UNSHARE[0]) is None:
        return "util-linux's unshare is not installed"
    probe = subprocess.run(
        [*_UNSHARE, sys.executable, "-c", "pass"], capture_output=True, text=True, timeout=30
    )
    if probe.returncode != 0:
        return f"unshare --net --map-root-user failed: {probe.stderr.strip()}"
    return None


def run_workers(
    target: str, args: dict[str, Any] | None = None, timeout: float = 180, *, seed: int = 0
) -> list[dict[str, Any]]:
    """Run ``target`` in 2 workers of a ``MultiWorkerMirroredStrategy`` cluster on 127.0.0.1.

    Args:
        target: ``"module:function"``, the module importable with tests/ on ``sys.path``.
            Each worker calls ``function(strategy, **args)`` and it returns a dict that
            ``json.dumps`` takes. ``strategy.cluster_resolver.task_id`` is the worker's index.
        args: keyword arguments for the function, the same for both workers (JSON values).
        timeout: seconds both workers together may take, TensorFlow's import included;
            at ``timeout`` both are killed.
        seed: ``keras.utils.set_random_seed``'s seed in both workers.

    Returns:
        The function's results, worker 0's first.

    Raises:
        WorkerError: a worker raised (the message names the worker, its exception and
            traceback), died, or the pair ran past ``timeout``; the message ends with each
            worker's stderr tail. Both workers are dead by then.
        RuntimeError: no network namespace can be made here (``isolation_problem``).
    """
    module, _, function = target.partition(":")
    if not module or not function:
        raise ValueError(f"target {target!r} must be 'module:function'")
    if timeout <= 0:
        raise ValueError(f"timeout={timeout!r} must be positive")
    args = dict(args or {})
    spec = {
        "target": target,
        "args": args,
        "seed": seed,
        "timeout": timeout,
        "caller_netns": os.readlink("/proc/self/ns/net"),
    }
    encoded = json.dumps(spec)  # a bad argument fails here, not in both workers
    if shutil.which(_UNSHARE[0]) is None:
        raise RuntimeError(f"run_workers cannot isolate its workers: {isolation_problem()}")
    with tempfile.TemporaryDirectory(prefix="multiworker-") as tmp:
        folder = Path(tmp)
        (folder / "spec.json").write_text(encoded)
        hung = _supervise_in_namespace(folder, timeout + GRACE)
        return _collect(folder, hung)


def _supervise_in_namespace(folder: Path, wait: float) -> bool:
    """Run the supervisor in a new network namespace; kill its process group (it and both
    workers, started in its session) if it outlives ``wait`` (then True) or dies without a
    status."""
    command = [*_UNSHARE, sys.executable, "-c", _BOOT, "supervise", str(folder)]
    with open(folder / "supervisor.log", "wb") as log:
        supervisor = subprocess.Popen(
            command, stdin=subprocess.DEVNULL, stdout=log, stderr=log, start_new_session=True
        )
        try:
            supervisor.wait(wait)
        except subprocess.TimeoutExpired:
            _kill_group(supervisor.pid)
            supervisor.wait()
            return True
    if not (folder / "status.json").exists():  # it died before killing its workers
        _kill_group(supervisor.pid)
    return False


def _kill_group(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError):  # nothing of the group is left
        os.killpg(pid, signal.SIGKILL)


def _collect(folder: Path, hung: bool) -> list[dict[str, Any]]:
    """The workers' results, or a ``WorkerError`` built from the status and the logs."""
    status_file = folder / "status.json"
    if not status_file.exists():
        what = "hung past its grace and was killed" if hung else "died"
        log = _tail(folder / "supervisor.log")
        raise WorkerError(
            f"the multi-worker supervisor {what} before it reported:\n{log}",
            failed=[],
            timed_out=hung,
        )
    status = json.loads(status_file.read_text())
    if not status["failed"] and not status["timed_out"]:
        return [json.loads((folder / f"result{i}.json").read_text()) for i in range(WORKERS)]
    lines = []
    if status["timed_out"]:
        lines.append(f"the workers ran past their timeout of {status['timeout']} s; both killed")
    for index in status["failed"]:
        lines.append(f"worker {index} failed: {_error_text(folder, index, status)}")
    for index in status["killed"]:
        lines.append(f"worker {index} was killed after that")
    for index in range(WORKERS):
        lines.append(f"--- worker {index} stderr (last {TAIL_LINES} lines) ---")
        lines.append(_tail(folder / f"worker{index}.log"))
    raise WorkerError("\n".join(lines), failed=status["failed"], timed_out=status["timed_out"])


def _error_text(folder: Path, index: int, status: dict[str, Any]) -> str:
    error_file = folder / f"error{index}.json"
    if error_file.exists():
        error = json.loads(error_file.read_text())
        return f"{error['type']}: {error['message']}\n{error['traceback']}"
    code = status["returncodes"][index]
    if code is not None and code < 0:
        return f"died of signal {signal.Signals(-code).name}"
    return f"exited with code {code} and no error record"


def _tail(path: Path) -> str:
    if not path.exists():
        return "(no output)"
    lines = path.read_text(errors="replace").splitlines()
    return "\n".join(lines[-TAIL_LINES:]) or "(empty)"


def _supervise(folder: Path) -> None:
    """In the new namespace: start both workers, wait, kill them all on the first failure
    or at the timeout, and write ``status.json``."""
    spec = json.loads((folder / "spec.json").read_text())
    _require_isolated(spec["caller_netns"])
    _bring_up_loopback()
    ports = _free_ports(WORKERS)
    cluster = {"worker": [f"{HOST}:{port}" for port in ports]}
    started = time.monotonic()
    workers = [_start_worker(folder, index, cluster) for index in range(WORKERS)]
    failed: list[int] = []
    deadline = started + spec["timeout"]
    while True:
        codes = [worker.poll() for worker in workers]
        failed = [i for i, code in enumerate(codes) if code not in (None, 0)]
        failed += [i for i in range(WORKERS) if i not in failed and _errored(folder, i)]
        if failed or None not in codes or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    timed_out = not failed and None in codes
    killed = [i for i, worker in enumerate(workers) if worker.poll() is None and i not in failed]
    for worker in workers:
        if worker.poll() is None:
            worker.kill()
        worker.wait()
    status = {
        "ports": ports,
        "failed": sorted(failed, key=lambda i: _error_time(folder, i)),
        "killed": killed,
        "timed_out": timed_out,
        "timeout": spec["timeout"],
        "returncodes": [worker.returncode for worker in workers],
        "seconds": round(time.monotonic() - started, 2),
    }
    _write_json(folder / "status.json", status)


def _require_isolated(caller_netns: str) -> None:
    """Refuse to start a server unless this is a new network namespace holding only lo."""
    here = os.readlink("/proc/self/ns/net")
    if here == caller_netns:
        raise RuntimeError(f"the supervisor runs in its caller's network namespace ({here})")
    with open("/proc/net/dev") as table:
        interfaces = [line.split(":")[0].strip() for line in table.readlines()[2:]]
    if interfaces != ["lo"]:
        raise RuntimeError(f"the workers' network namespace has interfaces {interfaces}")


def _bring_up_loopback() -> None:
    # A new network namespace's lo is down: nothing, not even 127.0.0.1, is reachable.
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        request = struct.pack(_IFREQ, b"lo", 0)
        flags = struct.unpack(_IFREQ, fcntl.ioctl(sock, _SIOCGIFFLAGS, request))[1]
        fcntl.ioctl(sock, _SIOCSIFFLAGS, struct.pack(_IFREQ, b"lo", flags | _IFF_UP))


def _free_ports(count: int) -> list[int]:
    """``count`` distinct free ports on 127.0.0.1, each socket held until all are picked."""
    sockets = [socket.socket(socket.AF_INET, socket.SOCK_STREAM) for _ in range(count)]
    try:
        for sock in sockets:
            sock.bind((HOST, 0))
        return [sock.getsockname()[1] for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()


def _start_worker(folder: Path, index: int, cluster: dict[str, list[str]]) -> subprocess.Popen:
    env = {
        **os.environ,
        "TF_CONFIG": json.dumps({"cluster": cluster, "task": {"type": "worker", "index": index}}),
        "CUDA_VISIBLE_DEVICES": "",
        "TF_CPP_MIN_LOG_LEVEL": "2",
    }
    with open(folder / f"worker{index}.log", "wb") as log:
        return subprocess.Popen(
            [sys.executable, "-c", _BOOT, "work", str(folder), str(index)],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=log,
            env=env,
        )


def _errored(folder: Path, index: int) -> bool:
    return (folder / f"error{index}.json").exists()


def _error_time(folder: Path, index: int) -> float:
    # A worker that died without a record sorts by when the supervisor saw it, i.e. now.
    path = folder / f"error{index}.json"
    return json.loads(path.read_text())["time"] if path.exists() else time.time()


def _work(folder: Path, index: int) -> None:
    """One worker: the strategy first, then the seed, then the target; its result or its
    error to the folder."""
    spec = json.loads((folder / "spec.json").read_text())
    phases = _Phases(index)
    try:
        import tensorflow as tf

        phases.done("tensorflow imported")
        # Before the context starts: after it, the pools' sizes are fixed.
        tf.config.threading.set_intra_op_parallelism_threads(1)
        tf.config.threading.set_inter_op_parallelism_threads(1)
        # Before any other op: the strategy configures the collective ops at context start.
        strategy = tf.distribute.MultiWorkerMirroredStrategy()
        phases.done("strategy built")
        import keras

        keras.utils.set_random_seed(spec["seed"])
        target = _resolve(spec["target"])
        phases.done("keras and the target imported")
        result = target(strategy, **spec["args"])
        phases.done("target returned")
        _write_json(folder / f"result{index}.json", result)
    except BaseException as error:
        record = {
            "type": type(error).__qualname__,
            "message": str(error),
            "traceback": traceback.format_exc(),
            "time": time.time(),
        }
        _write_json(folder / f"error{index}.json", record)
        sys.stderr.flush()
        # Not a normal exit: that would wait in the coordination service's shutdown
        # barrier for a peer that may be blocked in a collective this worker never joins.
        os._exit(1)


class _Phases:
    """One stderr line per phase of a worker, with its seconds: where a slow pair spends."""

    def __init__(self, index: int) -> None:
        self.index = index
        self.last = time.monotonic()

    def done(self, phase: str) -> None:
        now = time.monotonic()
        seconds = now - self.last
        print(f"multiworker: worker {self.index}: {phase} in {seconds:.1f} s", file=sys.stderr)
        sys.stderr.flush()
        self.last = now


def _resolve(target: str) -> Callable[..., dict[str, Any]]:
    module, _, function = target.partition(":")
    return getattr(importlib.import_module(module), function)


def _write_json(path: Path, value: Any) -> None:
    # Written whole, then renamed: a reader never sees half a file.
    partial = path.with_suffix(".partial")
    partial.write_text(json.dumps(value))
    partial.replace(path)


def _main(argv: list[str]) -> None:
    command, folder, *rest = argv
    if command == "supervise":
        _supervise(Path(folder))
    elif command == "work":
        _work(Path(folder), int(rest[0]))
    else:
        raise SystemExit(f"unknown command {command!r}")
