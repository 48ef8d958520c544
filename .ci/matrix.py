"""Record a tox matrix run in reports/matrix.csv and rewrite reports/matrix.md from it.

    tox run -e py311-tf216-float32 --result-json /tmp/cell.json
    python .ci/matrix.py /tmp/cell.json [more.json ...]

Each env of each ``--result-json`` file becomes one row of ``reports/matrix.csv`` (a row of
the same env from an earlier run is replaced): its Python, TensorFlow, Keras and
Hypothesis versions as the env installed them (tox's ``pip freeze``), pytest's counts and
time from the env's own output, tox's exit code, when tox wrote the file, the commit it
ran (``-dirty`` with uncommitted changes) and the CPU of the machine this script runs on
(run it where the cells ran). ``reports/matrix.md`` is then written from the CSV and from
``tox -l``: every cell the matrix declares, green, red or not run.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import re
import subprocess
import sys
from pathlib import Path

import pandas as pd

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # this checkout's stability, also when it is not installed

from stability.core.environment import cpu, short_cpu  # noqa: E402
from stability.core.files import atomic_write_text  # noqa: E402

#: The columns of reports/matrix.csv, one row per env.
FIELDS = (
    "env",
    "python",
    "tensorflow",
    "keras",
    "hypothesis",
    "passed",
    "failed",
    "errors",
    "skipped",
    "xfailed",
    "xpassed",
    "seconds",
    "exit_code",
    "date",
    "commit",
    "cpu",
)

#: The columns that hold numbers (the rest are text).
NUMBERS = ("passed", "failed", "errors", "skipped", "xfailed", "xpassed", "seconds", "exit_code")

#: pytest's last line: "1218 passed, 2 xfailed, 3 warnings in 693.12s (0:11:33)".
SUMMARY = re.compile(r"^=*\s*(?P<counts>(?:\d+ \w+(?:, )?)+) in (?P<seconds>[\d.]+)s\b", re.M)
COUNT = re.compile(r"(\d+) (\w+)")
#: pytest's words for its counts, as the CSV's columns name them.
WORDS = {
    "error": "errors",
    "errors": "errors",
    "passed": "passed",
    "failed": "failed",
    "skipped": "skipped",
    "xfailed": "xfailed",
    "xpassed": "xpassed",
}


class MatrixError(Exception):
    """A result file this script cannot read; one line, exit 2."""


def package_versions(frozen: list[str]) -> dict[str, str]:
    """{name: version} from ``pip freeze`` lines (``tensorflow==2.21.0``), names lowered."""
    versions = {}
    for line in frozen:
        name, sep, version = line.partition("==")
        if sep:
            versions[name.strip().lower().replace("_", "-")] = version.strip()
    return versions


def frozen_packages(result: dict) -> list[str]:
    """The env's ``pip freeze`` lines: tox's own record, or, where tox wrote none (it leaves
    ``installed_packages`` out of some recreated envs), a ``pip freeze`` by the env's
    interpreter, the one its install step ran (this script runs where the cells ran)."""
    if result.get("installed_packages"):
        return result["installed_packages"]
    for step in result.get("setup", []):
        command = step.get("command") or []
        if command and Path(command[0]).exists() and command[1:4] == ["-I", "-m", "pip"]:
            frozen = subprocess.run(
                [command[0], "-m", "pip", "freeze", "--all"],
                capture_output=True,
                text=True,
                check=False,
            )
            return frozen.stdout.splitlines()
    return []


def pytest_counts(output: str) -> dict[str, float]:
    """The counts and seconds of pytest's last summary line in ``output`` (empty if none)."""
    found = list(SUMMARY.finditer(output))
    if not found:
        return {}
    last = found[-1]
    counts = {column: 0 for column in set(WORDS.values())}
    for number, word in COUNT.findall(last["counts"]):
        if word in WORDS:
            counts[WORDS[word]] += int(number)
    return {**counts, "seconds": float(last["seconds"])}


def env_rows(path: Path, commit: str, cpu: str) -> list[dict[str, object]]:
    """One row per env of the tox result file at ``path``."""
    try:
        report = json.loads(path.read_text(encoding="utf-8"))
        envs = report["testenvs"]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise MatrixError(f"{path}: not a tox --result-json file ({exc})") from None
    written = dt.datetime.fromtimestamp(path.stat().st_mtime, dt.UTC)
    rows = []
    for env, result in envs.items():
        if env == ".pkg" or "result" not in result:
            continue  # tox's packaging env: it runs no commands of ours
        versions = package_versions(frozen_packages(result))
        output = "".join(step.get("output", "") for step in result.get("test", []))
        python = result.get("python", {}).get("version_info", [])
        rows.append(
            {
                "env": env,
                "python": ".".join(str(p) for p in python[:3]),
                "tensorflow": versions.get("tensorflow", ""),
                "keras": versions.get("keras", ""),
                "hypothesis": versions.get("hypothesis", ""),
                **pytest_counts(output),
                "exit_code": result["result"].get("exit_code"),
                "date": written.strftime("%Y-%m-%d %H:%M UTC"),
                "commit": commit,
                "cpu": cpu,
            }
        )
    return rows


def current_commit() -> str:
    def git(*args: str) -> str:
        return subprocess.run(
            ["git", *args], cwd=ROOT, capture_output=True, text=True, check=False
        ).stdout.strip()

    head = git("rev-parse", "--short=12", "HEAD") or "unknown"
    return head + ("-dirty" if git("status", "--porcelain", "--untracked-files=no") else "")


def declared_envs() -> list[str]:
    """The envs of ``tox -l``: the matrix as tox.ini declares it."""
    listed = subprocess.run(
        [sys.executable, "-m", "tox", "-l"], cwd=ROOT, capture_output=True, text=True, check=True
    )
    return [line.strip() for line in listed.stdout.splitlines() if line.strip()]


def merged(old: pd.DataFrame, new_rows: list[dict[str, object]]) -> pd.DataFrame:
    """``old`` with each env of ``new_rows`` replaced by its new row."""
    new = pd.DataFrame(new_rows, columns=list(FIELDS))
    kept = old[~old["env"].isin(new["env"])] if not old.empty else old
    return pd.concat([kept, new], ignore_index=True)[list(FIELDS)]


def verdict(row: pd.Series) -> str:
    if row["exit_code"] != 0:
        return "red"
    return "green" if pd.isna(row["failed"]) or row["failed"] == 0 else "red"


def markdown(frame: pd.DataFrame, declared: list[str]) -> str:
    """reports/matrix.md: every declared cell, with its record or "not run"."""
    by_env = frame.set_index("env")
    ran = [env for env in declared if env in by_env.index]
    green = [env for env in ran if verdict(by_env.loc[env]) == "green"]
    red = [env for env in ran if env not in green]
    missing = [env for env in declared if env not in by_env.index]
    lines = [
        "# The tox matrix",
        "",
        "Written by `python .ci/matrix.py` from tox's `--result-json` files "
        "([development.md](../docs/development.md#tox)); one row per env of `tox -l`.",
        "",
        f"Of the {len(declared)} env(s) `tox -l` declares, {len(green)} ran green, "
        f"{len(red)} ran red and {len(missing)} have no record"
        + (f": {', '.join(missing)}." if missing else "."),
    ]
    if red:
        lines.append(f"Red: {', '.join(red)}.")
    commits = sorted(set(by_env.loc[ran, "commit"])) if ran else []
    if len(commits) > 1:
        lines.append(f"The cells ran at {len(commits)} commits: {', '.join(commits)}.")
    extra = sorted(set(by_env.index) - set(declared))
    if extra:
        lines.append(f"Recorded but no longer declared (not counted): {', '.join(extra)}.")
    table = []
    for env in declared:
        if env not in by_env.index:
            table.append({"env": env, "result": "not run"})
            continue
        row = by_env.loc[env]
        table.append(
            {
                "env": env,
                "result": verdict(row),
                **{c: _cell(row[c]) for c in FIELDS if c not in ("env", "exit_code", "cpu")},
                "cpu": short_cpu(_cell(row["cpu"])),
            }
        )
    shown = pd.DataFrame(table).fillna("")
    return "\n".join([*lines, "", shown.to_markdown(index=False), ""])


def _cell(value: object) -> str:
    if isinstance(value, float):
        return "" if pd.isna(value) else f"{value:g}"
    return "" if value is None else str(value)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "results",
        nargs="+",
        type=Path,
        metavar="RESULT_JSON",
        help="files tox wrote with --result-json",
    )
    parser.add_argument("--cpu", help="the CPU the cells ran on (default: this machine's)")
    parser.add_argument(
        "--out",
        type=Path,
        default=ROOT / "reports",
        help="folder of matrix.csv and matrix.md (default: reports/)",
    )
    args = parser.parse_args(argv)
    csv_path, md_path = args.out / "matrix.csv", args.out / "matrix.md"
    try:
        rows = [r for p in args.results for r in env_rows(p, current_commit(), args.cpu or cpu())]
    except MatrixError as exc:
        print(f"matrix: error: {exc}", file=sys.stderr)
        return 2
    old = pd.read_csv(csv_path, dtype=str) if csv_path.exists() else pd.DataFrame(columns=FIELDS)
    frame = merged(old.astype(object), rows)
    for column in NUMBERS:
        frame[column] = pd.to_numeric(frame[column], errors="coerce")
    atomic_write_text(csv_path, frame.to_csv(index=False))
    atomic_write_text(md_path, markdown(frame, declared_envs()))
    print(f"recorded {', '.join(r['env'] for r in rows)}; wrote {csv_path} and {md_path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
