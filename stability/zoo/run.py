"""The zoo run: every bug of ``stability/zoo/bugs`` through the harness and the doctor, and
through the tools people use today (``stability.zoo.tools``), for ``python -m stability zoo``.

A bug is a case file there, ``<name>.toml``, whose plugin module defines the bug's variant,
its data where it needs its own, and ``BUG``, its ground truth (``stability.zoo.bug``). The
harness's run of a bug is the doctor's original run. The doctor is given, not imported (a
feature never imports another): the command line passes ``doctor_many``, which trains every
bug's runs in one sweep (all originals, then all remedies), so ``--workers`` stay busy
across bugs. Each bug's runs go to ``<out>/zoo/<name>.doctor/`` as ordinary stores, so
``--resume`` works.
"""

from __future__ import annotations

import multiprocessing
import sys
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

from tqdm.auto import tqdm

from stability.core.errors import StabilityError
from stability.sweep.cases import Case, load_case
from stability.sweep.workers import start_worker, variant_modules
from stability.zoo.bug import ZooBug
from stability.zoo.tools import TOOLS, tool_run

#: Where the bugs' case files and modules are: the package data of ``stability.zoo.bugs``,
#: found by ``importlib.resources`` wherever the package is installed. (A bug is loaded as a
#: case file whose plugin is a ``.py`` path, so the package must be on a file system.)
BUGS = Path(str(resources.files("stability.zoo.bugs")))

#: The task name of the check among the tools' tasks.
CHECK = "check"


@dataclass
class ZooEntry:
    """One bug: its case file and case, its ground truth, its doctor and the tools' runs."""

    path: Path
    case: Case
    bug: ZooBug
    doctor: Any = None  # the doctor's run of the bug (``Doctor``)
    tools: dict[str, dict] = field(default_factory=dict)
    check: dict[str, dict] = field(default_factory=dict)  # the ``Checker``'s score


def bug_files(folder: Path = BUGS) -> list[Path]:
    """The zoo's case files, in name order."""
    return sorted(folder.glob("*.toml"))


def bug_names(text: str | None) -> list[str]:
    """``--bugs a,b`` as a list of names; none given, all bugs."""
    return [n.strip() for n in (text or "").split(",") if n.strip()]


def load_bug(path: Path) -> ZooEntry:
    """A bug's case (its plugin imported) and its ``BUG``, checked against the case."""
    case = load_case(path)
    modules = [sys.modules.get(Path(p).stem) for p in case.plugins]
    bugs = [getattr(m, "BUG", None) for m in modules if m is not None]
    bugs = [b for b in bugs if isinstance(b, ZooBug)]
    if len(bugs) != 1:
        raise StabilityError(f"{path}: its plugin must define one BUG = ZooBug(...)")
    (bug,) = bugs
    if bug.name != case.name or bug.variant not in case.variants:
        raise StabilityError(
            f"{path}: BUG names {bug.name!r} and variant {bug.variant!r}; the case is "
            f"{case.name!r} with variants {list(case.variants)}"
        )
    return ZooEntry(path, case, bug)


#: The doctor the zoo scores: ``doctor(requests)`` doctors every ``(case, variant, out)`` and
#: returns one run each, with ``finding``, ``trials`` and ``recommended()`` (what
#: ``stability.zoo.report`` reads). The command line passes the doctor's ``doctor_many``; the
#: zoo does not import the doctor, so the two features stay apart.
Doctor = Callable[[Sequence[tuple[Case, str, Path]]], Sequence[Any]]

#: The check the zoo scores: ``checker(case_path, variant, repair)`` returns, for each of
#: ``own data`` and ``generated``, a dict with ``detected``, ``properties``, ``stage``, ``op``
#: and ``seconds``; with ``repair`` (a bug training does not show failing) and something
#: broken, also ``repair``: the doctor of broken invariants' ``recommended`` fix, its
#: ``fix_class``, its ``code`` and every repair's ``verdicts``. The command line passes
#: ``stability.commands.check_doctor.check_and_repair``, a module-level function a worker
#: process can import; the zoo imports neither the check nor the doctor.
Checker = Callable[[str, str, bool], dict]


def run_zoo(
    out: Path,
    doctor: Doctor,
    names: Sequence[str] = (),
    workers: int = 1,
    progress: bool = True,
    resume: bool = False,
    overwrite: bool = False,
    on_stage: Callable[[str], None] | None = None,
    folder: Path = BUGS,
    checker: Checker | None = None,
) -> list[ZooEntry]:
    """Every bug (or those in ``names``) through the doctor, the tools and ``checker``."""
    say = on_stage or (lambda text: None)
    entries = [load_bug(path) for path in bug_files(folder)]
    if names:
        known = {e.bug.name for e in entries}
        unknown = [n for n in names if n not in known]
        if unknown:
            raise StabilityError(
                f"--bugs: no zoo bug {unknown[0]!r}; the zoo has {', '.join(sorted(known))}"
            )
        entries = [e for e in entries if e.bug.name in names]
    requests = [(e.case, e.bug.variant, out / f"{e.case.name}.doctor") for e in entries]
    for entry, run in zip(entries, doctor(requests), strict=True):
        entry.doctor = run
    say(f"running {', '.join(TOOLS)}{' and the check' if checker else ''} on {len(entries)} bugs")
    run_tools(entries, workers, progress, checker)
    return entries


def run_tools(
    entries: Sequence[ZooEntry], workers: int, progress: bool, checker: Checker | None = None
) -> None:
    """Every tool (and ``checker``) on every bug, in ``workers`` spawned processes of the
    runs' layout."""
    tasks = [(entry, tool) for entry in entries for tool in TOOLS]
    if checker is not None:
        tasks += [(entry, CHECK) for entry in entries]
    modules = variant_modules([e.bug.variant for e in entries])
    context = multiprocessing.get_context("spawn")
    bar = tqdm(total=len(tasks), desc="tools", unit="run", disable=not progress)
    with ProcessPoolExecutor(
        max_workers=workers,
        mp_context=context,
        initializer=start_worker,
        initargs=(1, 1, modules, list(sys.path)),
    ) as pool:
        futures = [
            (
                entry,
                tool,
                pool.submit(checker, str(entry.path), entry.bug.variant, not trained_failure(entry))
                if tool == CHECK
                else pool.submit(tool_run, str(entry.path), tool),
            )
            for entry, tool in tasks
        ]
        for entry, tool, future in futures:
            if tool == CHECK:
                entry.check = future.result()
            else:
                entry.tools[tool] = future.result()
            bar.update(1)
    bar.close()


def trained_failure(entry: ZooEntry) -> bool:
    """Whether the doctor's training of the bug showed a failure (a NaN, a silent failure or
    a divergence; a headroom warning is no failure)."""
    symptom = getattr(getattr(entry.doctor, "finding", None), "symptom", None)
    return symptom not in (None, "headroom")
