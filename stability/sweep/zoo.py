"""The zoo run: every bug of ``stability/zoo/bugs`` through the harness and the doctor, and
through the tools people use today (``zoo_tools``), for ``python -m stability zoo``.

A bug is a case file there, ``<name>.toml``, whose plugin module defines the bug's variant,
its data where it needs its own, and ``BUG``, its ground truth (``zoo_bug.ZooBug``). The
harness's run of a bug is the doctor's original run; every bug's runs train in one sweep
(all originals, then all remedies), so ``--workers`` stay busy across bugs. Each bug's
runs go to ``<out>/zoo/<name>.doctor/`` as ordinary stores, so ``--resume`` works.
"""

from __future__ import annotations

import multiprocessing
import sys
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from tqdm.auto import tqdm

from stability.core.errors import StabilityError
from stability.sweep.cases import Case, load_case
from stability.sweep.doctor import DoctorRun, begin, conclude, train_trials
from stability.sweep.workers import start_worker, variant_modules
from stability.sweep.zoo_bug import ZooBug
from stability.sweep.zoo_tools import TOOLS, tool_run

#: Where the bugs' case files and modules are, in the installed package.
BUGS = Path(__file__).resolve().parent.parent / "zoo" / "bugs"


@dataclass
class ZooEntry:
    """One bug: its case file and case, its ground truth, its doctor and the tools' runs."""

    path: Path
    case: Case
    bug: ZooBug
    doctor: DoctorRun | None = None
    tools: dict[str, dict] = field(default_factory=dict)


def bug_files(folder: Path = BUGS) -> list[Path]:
    """The zoo's case files, in name order."""
    return sorted(folder.glob("*.toml"))


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


def run_zoo(
    out: Path,
    names: Sequence[str] = (),
    workers: int = 1,
    progress: bool = True,
    resume: bool = False,
    overwrite: bool = False,
    on_stage: Callable[[str], None] | None = None,
    folder: Path = BUGS,
) -> list[ZooEntry]:
    """Every bug (or those in ``names``) through the doctor and the tools."""
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
    for entry in entries:
        entry.doctor = begin(entry.case, entry.bug.variant, out / f"{entry.case.name}.doctor")
    say(f"training {len(entries)} bugs")
    doctors = [e.doctor for e in entries]
    train_trials([d.original for d in doctors], progress, resume, overwrite, workers, None, "bugs")
    for doctor in doctors:
        conclude(doctor)
    trials = [t for d in doctors for t in d.trials]
    say(f"rerunning {sum(t.case is not None for t in trials)} remedies")
    train_trials(trials, progress, resume, overwrite, workers, None, "remedies", tolerate=True)
    say(f"running {', '.join(TOOLS)} on {len(entries)} bugs")
    run_tools(entries, workers, progress)
    return entries


def run_tools(entries: Sequence[ZooEntry], workers: int, progress: bool) -> None:
    """Every tool on every bug, in ``workers`` spawned processes of the runs' layout."""
    tasks = [(entry, tool) for entry in entries for tool in TOOLS]
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
            (entry, tool, pool.submit(tool_run, str(entry.path), tool)) for entry, tool in tasks
        ]
        for entry, tool, future in futures:
            entry.tools[tool] = future.result()
            bar.update(1)
    bar.close()
