"""The pytest plugin: put variants under the harness's checks in any test suite.

- The ``stability_run`` fixture trains a case (a file or a ``Case``), records its runs for
  the session's report and returns them, so a test can assert on them.
- The ``segment_softmax_conformance`` fixture checks a segment softmax at the dtype's
  limits and fails the test with each shrunk counterexample: one line in a user's suite,
  ``segment_softmax_conformance(my_softmax)``.
- The ``stability_check`` fixture runs ``stability check`` on a case's variants, without
  training, and fails the test with every property that failed and its counterexample.
- ``pytest --stability-report DIR`` writes, at the end of the session, the reports of every
  case run through the fixture: ``<case>.csv``, ``<case>.history.csv``, ``<case>.md`` and
  the plots.

Exposed through the ``pytest11`` entry point ``stability.plugin``; named after the module,
so ``-p stability.plugin`` and the entry point never register it twice.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pytest

_REPORT = pytest.StashKey["StabilityReport"]()


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("stability", "numerical-stability reports")
    group.addoption(
        "--stability-report",
        metavar="DIR",
        type=Path,
        default=None,
        help="write the reports of every case run through `stability_run` into DIR",
    )


def pytest_configure(config: pytest.Config) -> None:
    report = StabilityReport(config.getoption("stability_report"))
    config.stash[_REPORT] = report
    config.pluginmanager.register(report, "stability-report")


def pytest_unconfigure(config: pytest.Config) -> None:
    report = config.stash.get(_REPORT, None)
    if report is not None:
        config.pluginmanager.unregister(report)


class StabilityReport:
    """The runs of one pytest session, per case; writes their reports when it finishes."""

    def __init__(self, out_dir: Path | None):
        self.out_dir = out_dir
        self.cases: dict[str, tuple[Any, list[Any]]] = {}  # case name -> (Case, RunResults)
        self.written: list[Path] = []

    def add(self, case: Any, results: Sequence[Any]) -> None:
        _, known = self.cases.setdefault(case.name, (case, []))
        known.extend(results)

    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        if self.out_dir is None or not self.cases:
            return
        from stability.core.files import atomic_writer
        from stability.report.writer import history_frame, results_frame, write_reports

        self.out_dir.mkdir(parents=True, exist_ok=True)
        for name, (case, results) in self.cases.items():
            frame, history = results_frame(results), history_frame(results)
            # Atomically, like `python -m stability run`: a reader never sees half a file.
            for table, suffix in ((frame, ".csv"), (history, ".history.csv")):
                with atomic_writer(self.out_dir / f"{name}{suffix}") as handle:
                    table.to_csv(handle, index=False)
            self.written.append(write_reports(frame, self.out_dir, name, case.description, history))

    def pytest_terminal_summary(self, terminalreporter: Any) -> None:
        for path in self.written:
            terminalreporter.write_line(f"stability: wrote {path}")


@pytest.fixture
def stability_run(request: pytest.FixtureRequest) -> Callable[..., list[Any]]:
    """Train a case and return its ``RunResult`` list; the session's report gets the runs.

    ``stability_run(case, variants=None, **overrides)``: ``case`` is a case file or a
    ``Case``; ``variants`` replaces the case's list; ``overrides`` replace other ``Case``
    fields (``epochs=5``, ``seeds=(0,)``). Bad input (a case file that does not validate,
    an override that is no ``Case`` field) fails the test in one line, without a traceback.
    """
    report = request.config.stash[_REPORT]

    def run(
        case: str | Path | Any, variants: Sequence[str] | None = None, **overrides: Any
    ) -> list[Any]:
        from stability.core.errors import StabilityError
        from stability.sweep.runner import run_case

        try:
            case = _case_of(case, variants, overrides)
            results = run_case(case, progress=False)
        except StabilityError as exc:
            pytest.fail(f"stability_run: {exc}", pytrace=False)
        report.add(case, results)
        return results

    return run


def _case_of(case: str | Path | Any, variants: Sequence[str] | None, overrides: dict) -> Any:
    """The ``Case`` to train: ``case`` loaded if it is a file, with the overrides applied;
    ``NameNotFound`` ("did you mean") for an override that is no ``Case`` field."""
    from stability.core.errors import NameNotFound
    from stability.sweep.cases import Case, load_case

    fields = [field.name for field in dataclasses.fields(Case)]
    for name in overrides:
        if name not in fields:
            raise NameNotFound("stability_run override", name, fields)
    if not isinstance(case, Case):
        case = load_case(case)
    if variants is not None:
        overrides = {**overrides, "variants": tuple(variants)}
    return dataclasses.replace(case, **overrides)


@pytest.fixture
def stability_check(tmp_path: Path) -> Callable[..., list[Any]]:
    """Check a case's variants without training (docs/check.md) and return the rows.

    ``stability_check(case, variants=None, properties=None, examples=60, expect_pass=True,
    **overrides)``: ``case``, ``variants`` and ``overrides`` as for ``stability_run``;
    ``properties`` the properties to check (default: all). With ``expect_pass``, a failing
    property fails the test with one line per failure and the case file of its
    counterexample (written under the test's ``tmp_path``).
    """

    def check(
        case: str | Path | Any,
        variants: Sequence[str] | None = None,
        properties: Sequence[str] | None = None,
        examples: int = 60,
        expect_pass: bool = True,
        **overrides: Any,
    ) -> list[Any]:
        from stability.check.properties import PROPERTIES
        from stability.check.run import Declared, check_variant
        from stability.core.errors import StabilityError

        try:
            case = _case_of(case, variants, overrides)
            Declared.of(case)
            rows = [
                row
                for variant in case.variants
                for row in check_variant(
                    case, variant, tmp_path, examples, properties=properties or PROPERTIES
                )
            ]
        except StabilityError as exc:
            pytest.fail(f"stability_check: {exc}", pytrace=False)
        failed = [r for r in rows if r.failed]
        if expect_pass and failed:
            lines = [
                f"{r.variant}: {r.property} fails on {r.setting}: {r.detail} "
                f"(counterexample: {r.counterexample})"
                for r in failed
            ]
            pytest.fail("stability_check:\n" + "\n".join(lines), pytrace=False)
        return rows

    return check


@pytest.fixture
def segment_softmax_conformance() -> Callable[..., Any]:
    """``stability.assert_segment_softmax_conforms``: ``segment_softmax_conformance(fn,
    dtypes=..., mask=..., profile=...)`` returns the ``ConformanceReport`` and fails the test
    with every failing property's counterexample (docs/conformance.md)."""
    from stability.testing.conformance import assert_segment_softmax_conforms

    return assert_segment_softmax_conforms
