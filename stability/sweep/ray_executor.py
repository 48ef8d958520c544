"""Ray as the executor of a sweep: one Ray task per run, on one machine or a cluster.

``RayCluster.connect`` starts a local Ray instance (no dashboard) or joins a running
cluster at ``--address HOST:PORT``. Ray is imported here only, and only
when ``--executor ray`` is chosen: the process pool (``stability.sweep.workers``) stays the
default and needs no Ray.

- Each run is one task asking for ``cpus_per_run`` CPUs; inside it TensorFlow's thread
  pools are sized before its first op to the runs' layout (``stability.train.threads``: 1
  intra-op and 1 inter-op thread unless measuring another), as in a worker process, so a
  task's rows are a serial run's. The thread count is part of the task's runtime
  environment, so Ray keeps workers of different thread counts apart (the pools can only be
  sized once per process).
- What a worker needs reaches it through Ray's runtime environment (``py_modules``): this
  ``stability`` package, so every node runs the driver's code, and the modules that
  register the sweep's variants (``--plugin`` modules). Data sets are built by the driver
  (from the case and its files) and put into Ray's object store once each; no case file
  is read on a worker.
- Results come back in the order runs finish (``ray.wait``) and go to the store at once;
  the list returned is in the order of the configs, as a serial sweep's.

Ray 2.60 cannot be bound to 127.0.0.1: it replaces a loopback ``--node-ip-address`` with the
machine's address and its servers listen on every interface (docs/cluster.md, security).
"""

from __future__ import annotations

import importlib
import logging
import os
import socket
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

from stability.core.errors import StabilityError
from stability.core.quiet import stderr_silenced
from stability.core.results import RunResult
from stability.sweep.workers import (
    Progress,
    RunConfig,
    in_serial_order,
    train_run,
    variant_modules,
)
from stability.train.threads import LAYOUT

#: The ``stability`` package folder, shipped to every worker.
PACKAGE = Path(__file__).resolve().parents[1]

#: How to get Ray, as the error says it.
INSTALL_HINT = 'pip install "stability[ray]"'

#: Seconds to wait for the head's port to answer before calling --address unreachable.
CONNECT_SECONDS = 5.0

#: Tasks in flight per CPU of the cluster: enough to keep every CPU busy while results
#: are stored, few enough that the driver waits on a short list (``ray.wait`` scans it).
TASKS_PER_CPU = 4


def import_ray() -> ModuleType:
    """Ray, or a one-line error saying how to install it."""
    try:
        import ray
    except ImportError:
        raise StabilityError(
            f"--executor ray needs Ray, which is not installed; install it with {INSTALL_HINT}"
        ) from None
    return ray


def parse_address(address: str) -> tuple[str, int]:
    """``HOST:PORT`` as (host, port), or a one-line error."""
    host, colon, port = address.rpartition(":")
    if not colon or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise StabilityError(
            f"--address {address!r}: expected HOST:PORT of a Ray head, such as 10.0.0.5:6379"
        )
    return host, int(port)


def check_reachable(address: str) -> None:
    """A one-line error unless something answers at ``address`` (ray.init would retry for
    a minute before failing with a traceback)."""
    host, port = parse_address(address)
    try:
        with socket.create_connection((host, port), timeout=CONNECT_SECONDS):
            pass
    except OSError as exc:
        reason = exc.strerror or type(exc).__name__
        raise StabilityError(
            f"--address {address}: no Ray head answers there ({reason}); start one with "
            "`ray start --head`, or leave out --address for a local Ray"
        ) from None


class RayCluster:
    """A connection to Ray that trains runs as tasks; ``shutdown`` when done."""

    def __init__(self, ray: ModuleType, owned: bool, modules: list[str], cpus_per_run: int):
        self.ray = ray
        self.owned = owned
        self.modules = modules
        self.cpus_per_run = cpus_per_run

    @classmethod
    def connect(
        cls, address: str | None, cpus_per_run: int = 1, modules: Sequence[str] = ()
    ) -> RayCluster:
        """Join the cluster at ``address``, or start a local Ray on this machine's cores;
        then check that every one of ``modules`` imports on a worker. A process that has
        Ray running already (a notebook, a test) uses that."""
        if cpus_per_run < 1:
            raise StabilityError(f"--cpus-per-run {cpus_per_run} must be at least 1")
        if address is not None:
            check_reachable(address)
        ray = import_ray()
        owned = not ray.is_initialized()
        if owned:
            _init(ray, address, job_environment(modules))
        cluster = cls(ray, owned, sorted(set(modules)), cpus_per_run)
        try:
            cpus = ray.cluster_resources().get("CPU", 0)
            if cpus < cpus_per_run:
                raise StabilityError(
                    f"--cpus-per-run {cpus_per_run}: the Ray cluster has {cpus:g} CPU(s)"
                )
            cluster._check_imports()
        except BaseException:
            cluster.shutdown()
            raise
        return cluster

    def shutdown(self) -> None:
        """Disconnect; a local instance this process started stops with it."""
        if self.owned and self.ray.is_initialized():
            self.ray.shutdown()

    def _task(self, function: Callable, intra: int) -> Any:
        # env_vars merge with the job's runtime environment (which ships the code); a
        # distinct thread count makes a distinct environment, so Ray starts distinct workers.
        env = {"env_vars": {"STABILITY_INTRA_THREADS": str(intra)}}
        return self.ray.remote(function).options(
            num_cpus=self.cpus_per_run, runtime_env=env, max_retries=0
        )

    def _check_imports(self) -> None:
        """Import the variant modules on a worker first, so that one that fails there ends
        the sweep with one line before anything is written."""
        task = self._task(_import_on_worker, LAYOUT[0])
        try:
            failure = self.ray.get(task.remote(self.modules))
        except self.ray.exceptions.RuntimeEnvSetupError as exc:
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise StabilityError(f"Ray could not set up a worker's environment: {first}") from None
        if failure is not None:
            raise StabilityError(f"plugin {failure} on a Ray worker")

    def run(
        self,
        configs: Sequence[RunConfig],
        progress: bool = True,
        on_result: Callable[[RunResult], None] | None = None,
        desc: str = "runs",
        intra_threads: int = LAYOUT[0],
    ) -> list[RunResult]:
        """Train every run of ``configs`` as a Ray task on ``intra_threads`` x 1 threads (the
        runs' layout). ``on_result`` sees each result as soon as its run finishes; the list
        returned is in the order of ``configs``."""
        ray = self.ray
        modules = sorted({*self.modules, *variant_modules([v for _, v, _ in configs])})
        task = self._task(_train_on_worker, intra_threads)
        # Each data set goes into the object store once, however many runs train on it.
        stored: dict[int, Any] = {}
        cpus = ray.cluster_resources().get("CPU", 1)
        window = max(2, int(TASKS_PER_CPU * cpus / self.cpus_per_run))
        finished: dict[int, RunResult] = {}
        pending: dict[Any, int] = {}
        queued = iter(enumerate(configs))
        bar = Progress(len(configs), desc, progress)
        try:
            while True:
                for index, (dataset, variant, config) in queued:
                    if id(dataset) not in stored:
                        stored[id(dataset)] = ray.put(dataset)
                    pending[task.remote(stored[id(dataset)], variant, config, modules)] = index
                    if len(pending) >= window:
                        break
                if not pending:
                    break
                ready, _ = ray.wait(list(pending), num_returns=1)
                for ref in ready:
                    result = ray.get(ref)
                    finished[pending.pop(ref)] = result
                    if on_result is not None:
                        on_result(result)
                    bar.update(result)
        except BaseException:
            for ref in pending:
                ray.cancel(ref, force=True)
            raise
        finally:
            bar.close()
        return in_serial_order(finished, len(configs))


def _source(module: ModuleType) -> str:
    """The folder of a package, or the file of a one-file module, to ship to workers."""
    paths = list(getattr(module, "__path__", []))
    if len(paths) > 1 or not (paths or getattr(module, "__file__", None)):
        raise StabilityError(
            f"module {module.__name__!r} cannot be shipped to Ray workers: it is a "
            "namespace package or has no file; make it a regular package or one file"
        )
    return paths[0] if paths else module.__file__


def job_environment(modules: Sequence[str]) -> dict[str, Any]:
    """The runtime environment of the sweep's Ray job: this ``stability`` package and the
    top-level packages (or one-file modules) of ``modules``, shipped to every worker. Ray
    uploads local code only for a whole job (``ray.init``), not per task."""
    tops = {name.partition(".")[0] for name in modules} - {"stability"}
    shipped = {_source(sys.modules[top]) for top in tops}
    return {
        "py_modules": sorted({str(PACKAGE), *shipped}),
        "excludes": ["__pycache__", "*.pyc"],
        "env_vars": {"TF_CPP_MIN_LOG_LEVEL": "2"},
    }


def _init(ray: ModuleType, address: str | None, runtime_env: dict[str, Any]) -> None:
    options: dict[str, Any] = {
        "runtime_env": runtime_env,
        "include_dashboard": False,
        "log_to_driver": False,  # the runs' lines are the driver's to print
        "logging_level": logging.ERROR,
    }
    if address is None:
        # "local": a new instance, even if another Ray runs on this machine (without it,
        # ray.init would join the cluster started last here).
        options |= {"address": "local", "num_cpus": os.cpu_count() or 1}
    else:
        options["address"] = address
    try:
        with stderr_silenced():
            ray.init(**options)
    except Exception as exc:  # Ray raises ConnectionError, RuntimeError, ValueError, ...
        where = f"--address {address}" if address else "a local Ray instance"
        message = " ".join(str(exc).split()) or type(exc).__name__
        if "InvalidAuthToken" in str(exc.__cause__):
            message = (
                "the cluster asks for its token; set RAY_AUTH_MODE=token and the head's "
                "token in RAY_AUTH_TOKEN or ~/.ray/auth_token (docs/cluster.md)"
            )
        raise StabilityError(f"{where}: Ray did not start: {message}") from None


#: The (intra, inter) thread counts this worker process's TensorFlow was sized with.
_SIZED: tuple[int, int] | None = None


def _size_threads(intra: int) -> None:
    """Size TensorFlow's thread pools before its first op; once per worker process."""
    global _SIZED
    if _SIZED is None:
        with stderr_silenced():  # TensorFlow's C++ start-up notices
            import tensorflow as tf

            from stability.train.threads import require

            require(intra, 1)
            tf.constant(0.0)
        _SIZED = (intra, 1)
    elif (intra, 1) != _SIZED:  # runtime_env keys workers by thread count: cannot happen
        raise RuntimeError(f"worker sized for {_SIZED} threads, asked for {(intra, 1)}")


def _import_on_worker(modules: list[str]) -> str | None:
    """Import ``modules`` in a worker; the first failure as one line, or None."""
    _size_threads(int(os.environ["STABILITY_INTRA_THREADS"]))
    for module in modules:
        try:
            importlib.import_module(module)
        except Exception as exc:
            return f"{module!r} failed to import: {type(exc).__name__}: {exc}"
    return None


def _train_on_worker(dataset, variant: str, config, modules: list[str]) -> RunResult:
    """One run, as a Ray task."""
    _size_threads(int(os.environ["STABILITY_INTRA_THREADS"]))
    for module in modules:
        importlib.import_module(module)
    return train_run(dataset, variant, config)
