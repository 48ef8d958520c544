"""--executor ray against a real Ray: a local instance, and a `ray start --head` cluster
joined with --address whose driver is killed with SIGKILL and resumed. Both end with the
rows of a serial sweep (timing columns aside); a plugin variant reaches the workers through
Ray's runtime environment. Bad input ends in one line and exit code 2, nothing written.

Every Ray here uses token authentication with a token made for this module
(RAY_AUTH_MODE=token, RAY_AUTH_TOKEN), as docs/cluster.md asks of a cluster. The head is
stopped by signalling its own process group (`ray start --block` stops the
processes it started), not with `ray stop`, which stops every Ray process on the machine.
"""

import contextlib
import os
import secrets
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest
from conftest import TINY_CASE, run_cli
from test_resume import kill_after_first_row, start, untimed

from stability.cli import main
from stability.model import variants
from stability.sweep.cases import parse_case
from stability.sweep.runner import run_case

RAY = Path(sys.executable).with_name("ray")

# Under pytest-xdist every Ray test runs in one worker process, one Ray at a time.
pytestmark = pytest.mark.xdist_group("ray")

# A variant that lives in a plugin file beside the case, not on any worker's path: the
# workers can only train it if the runtime environment ships it.
PLUGIN = '''
from stability import BuildContext, Recipe, create_recipe, register_variant


@register_variant
def plugin_e(ctx: BuildContext) -> Recipe:
    """the seed's model, registered by a plugin"""
    return create_recipe(ctx, softmax="stable")
'''
# 3 runs: at most 2 train at once on the 2 CPUs of a Ray here, so a kill after the first
# row lands mid-sweep.
CASE = TINY_CASE.replace('"raw_e", "stable_softmax"', '"raw_e", "plugin_e", "stable_softmax"')
# Imports in the driver (this process), fails anywhere else.
BAD_PLUGIN = """
import os

if os.environ.get("BAD_PLUGIN_DRIVER") != str(os.getpid()):
    raise ImportError("this plugin imports in the driver only")
"""


@pytest.fixture(scope="module", autouse=True)
def token():
    """One token for every Ray of this module (head, local instance, drivers)."""
    saved = {name: os.environ.get(name) for name in ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN")}
    os.environ["RAY_AUTH_MODE"] = "token"
    os.environ["RAY_AUTH_TOKEN"] = secrets.token_hex(32)
    yield
    for name, value in saved.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    """The case file and its plugins, in one folder."""
    folder = tmp_path_factory.mktemp("case")
    (folder / "tiny.toml").write_text(CASE)
    (folder / "raw.toml").write_text(TINY_CASE)  # needs no plugin
    (folder / "ray_test_plugin.py").write_text(PLUGIN)
    (folder / "bad_ray_plugin.py").write_text(BAD_PLUGIN)
    return folder


@pytest.fixture
def in_folder(folder, monkeypatch):
    """Run main() from the case folder, undoing the plugin's registration afterwards."""
    monkeypatch.chdir(folder)
    monkeypatch.setattr(sys, "path", list(sys.path))
    monkeypatch.setattr(variants, "_variants", variants._variants.copy())
    yield folder
    for name in ("ray_test_plugin", "bad_ray_plugin"):
        sys.modules.pop(name, None)


@pytest.fixture(scope="module")
def reference(folder, tmp_path_factory):
    """The serial sweep, in this process (the plugin imported and then forgotten)."""
    saved = variants._variants.copy()
    sys.path.insert(0, str(folder))
    try:
        __import__("ray_test_plugin")
        out = tmp_path_factory.mktemp("serial")
        run_case(parse_case(CASE, source="tiny"), out, progress=False)
    finally:
        sys.path.remove(str(folder))
        sys.modules.pop("ray_test_plugin", None)
        variants._variants = saved
    return untimed(out / "tiny.csv"), pd.read_csv(out / "tiny.history.csv")


def assert_serial_rows(out, reference):
    rows, history = reference
    assert set(rows["variant"]) == {"raw_e", "plugin_e", "stable_softmax"}
    pd.testing.assert_frame_equal(untimed(out / "tiny.csv"), rows)
    pd.testing.assert_frame_equal(pd.read_csv(out / "tiny.history.csv"), history)


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def test_a_local_ray_gives_the_serial_rows(in_folder, reference, tmp_path):
    """One local instance trains two cases: the plugin's (shipped by the runtime
    environment) and the case that 2 intra-op threads move (tests/test_thread_layout.py),
    which a Ray task trains on the fixed layout, as this process does. One run of both, so
    that the default test run starts one local Ray, not two."""
    from test_thread_layout import THREADS_CASE, rows

    run_case(parse_case(THREADS_CASE, source="threads"), tmp_path / "serial", progress=False)
    (in_folder / "threads.toml").write_text(THREADS_CASE)
    out = tmp_path / "out"
    code = main(
        [
            *("run", "tiny.toml", "threads.toml", "--plugin", "ray_test_plugin"),
            *("--executor", "ray", "--out", str(out), "--no-progress"),
        ]
    )
    assert code == 0
    import ray  # only now: Ray reads RAY_AUTH_MODE when first imported (fixture token)

    assert not ray.is_initialized(), "the local instance this run started must be stopped"
    assert_serial_rows(out, reference)
    pd.testing.assert_frame_equal(rows(out), rows(tmp_path / "serial"))


@pytest.fixture(scope="module")
def head(tmp_path_factory):
    """A one-node Ray cluster of 2 CPUs, started as an operator would; always stopped."""
    port = free_port()
    log = tmp_path_factory.mktemp("head") / "head.log"
    # No PYTHONPATH: the workers get this checkout's code from the runtime environment.
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    command = [str(RAY), "start", "--head", "--node-ip-address=127.0.0.1", f"--port={port}"]
    command += ["--num-cpus=2", "--include-dashboard=false", "--disable-usage-stats", "--block"]
    with log.open("w") as handle:
        process = subprocess.Popen(
            command, stdout=handle, stderr=subprocess.STDOUT, env=env, start_new_session=True
        )
    try:
        deadline = time.monotonic() + 120
        while "block forever" not in log.read_text():
            assert process.poll() is None, log.read_text()
            assert time.monotonic() < deadline, "the head did not start in 120 s"
            time.sleep(0.2)
        yield f"127.0.0.1:{port}"
    finally:
        stop_group(process)


def stop_group(process):
    """SIGTERM the head's process group, then SIGKILL whatever is left of it. (Here
    `ray start --block` and its processes were all still up 30 s after the SIGTERM: a
    longer wait only idles.)"""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGTERM)
    with contextlib.suppress(subprocess.TimeoutExpired):
        process.wait(timeout=0.5)  # a throwaway head: no need to drain it
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGKILL)
    process.wait()


def test_a_joined_cluster_killed_mid_sweep_then_resumed_gives_the_serial_rows(
    in_folder, head, reference, tmp_path
):
    """The killed driver is a process of its own; the resuming one is this process (the
    same command line, without another TensorFlow start)."""
    out = tmp_path / "out"
    flags = ("--plugin", "ray_test_plugin", "--executor", "ray", "--address", head)
    victim = start(in_folder / "tiny.toml", out, "--no-progress", *flags)
    kill_after_first_row(victim, out, 3)
    assert main(["run", "tiny.toml", "--out", str(out), "--no-progress", "--resume", *flags]) == 0
    import ray

    assert not ray.is_initialized(), "the resumed driver must leave the cluster"
    assert_serial_rows(out, reference)


def test_a_plugin_that_fails_to_import_on_a_worker(in_folder, head, tmp_path, capsys):
    os.environ["BAD_PLUGIN_DRIVER"] = str(os.getpid())
    try:
        out = tmp_path / "out"
        code = main(
            [
                *("run", "raw.toml", "--plugin", "bad_ray_plugin"),
                *("--executor", "ray", "--address", head, "--out", str(out), "--no-progress"),
            ]
        )
    finally:
        del os.environ["BAD_PLUGIN_DRIVER"]
    err = capsys.readouterr().err.strip()
    assert code == 2
    assert err.splitlines() == [err], "one line"
    assert "'bad_ray_plugin' failed to import" in err and "on a Ray worker" in err
    assert not out.exists(), "nothing written"


def test_an_unreachable_address(folder, tmp_path, capsys):
    out = tmp_path / "out"
    address = f"127.0.0.1:{free_port()}"  # nobody listens there
    code = main(
        [
            *("run", str(folder / "raw.toml"), "--executor", "ray"),
            *("--address", address, "--out", str(out)),
        ]
    )
    err = capsys.readouterr().err.strip()
    assert code == 2
    assert err.startswith(f"stability: error: --address {address}: no Ray head answers there")
    assert len(err.splitlines()) == 1
    assert not out.exists()


@pytest.mark.parametrize(
    "flags", [("--address", "127.0.0.1:1"), ("--cpus-per-run", "2")], ids=["address", "cpus"]
)
def test_ray_flags_need_the_ray_executor(folder, tmp_path, capsys, flags):
    out = tmp_path / "out"
    assert main(["run", str(folder / "raw.toml"), *flags, "--out", str(out)]) == 2
    assert "needs --executor ray" in capsys.readouterr().err
    assert not out.exists()


def test_ray_not_installed_says_how_to_install_it(folder, tmp_path, monkeypatch):
    """A Python in which `import ray` fails, as where Ray is not installed: None in
    sys.modules makes `import ray` raise ImportError, here as in a fresh process."""
    out = tmp_path / "out"
    monkeypatch.setitem(sys.modules, "ray", None)
    done = run_cli("run", "raw.toml", "--executor", "ray", "--out", str(out), cwd=folder)
    assert done.returncode == 2, done.stderr
    assert done.stderr.strip().splitlines() == [
        "stability: error: --executor ray needs Ray, which is not installed; install it with "
        'pip install "stability[ray]"'
    ]
    assert not out.exists()
