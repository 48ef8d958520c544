"""``stability check``: a variant's properties on its case's data and on generated graphs,
without training (``stability.check.properties``).

For each property the check asks, in turn:
1. **own data**: the case's data set, batch by batch as a run batches it (the ``step``
   property over every graph, the invariants over the first ``OWN_BATCHES`` batches);
2. **generated**: Hypothesis draws batches within the case's bounds
   (``stability.check.domain``) until one fails or ``examples`` have passed, and shrinks a
   failing batch to the smallest that still fails.

The ``step`` property runs on the weights as built (what a first training step sees); the
invariants after ``Subject.draw_zero_weights``, which gives Keras' zero biases small random
values: an invariant holds for any weights, and a zero bias hides the path it feeds.

A failing batch is written as a case (``sweep.case_file``) that ``run`` trains and
``check`` checks again.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from random import Random

from hypothesis import HealthCheck, Phase, find, settings
from hypothesis.errors import NoSuchExample

from stability.check.continuity import edge_continuity
from stability.check.domain import Domain
from stability.check.outcome import (
    FAIL,
    NOT_APPLICABLE,
    NOT_DECLARED,
    OWN_DATA,
    PASS,
    SETTINGS,
    CheckRow,
)
from stability.check.properties import (
    PROPERTIES,
    SEARCH,
    Predicate,
    Violation,
    attention_normalization,
    batch_independence,
    dtype_agreement,
    edge_order,
    node_permutation,
    step,
)
from stability.check.subject import Subject
from stability.core.errors import CaseError, ModelError, StabilityError
from stability.core.invariants import INVARIANTS
from stability.data import Dataset
from stability.data.graphs import Graph
from stability.model.variants import get_variant
from stability.sweep.case_file import write_data_case
from stability.sweep.cases import Case, load_case
from stability.sweep.runner import case_datasets, run_configs
from stability.train.config import TrainConfig
from stability.train.trainer import Trainer

#: Generated batches tried per property when none fails (a failing one is then shrunk).
DEFAULT_EXAMPLES = 60  # the command's --examples default too

#: Batches of the case's own data each invariant is checked on (the step sees every one).
OWN_BATCHES = 4

#: The seed of Hypothesis' draws: the same case, the same counterexamples.
HYPOTHESIS_SEED = 0


@dataclass(frozen=True)
class Declared:
    """What a case declares of its model (``[check]``): the invariants that hold for it (all
    by default) and the distance where its messages vanish (``cutoff``, none by default)."""

    invariants: tuple[str, ...] = INVARIANTS
    cutoff: float | None = None

    @classmethod
    def of(cls, case: Case) -> Declared:
        table = dict(case.check)
        invariants = tuple(table.get("invariants", INVARIANTS))
        unknown = [name for name in invariants if name not in INVARIANTS]
        if unknown:
            raise CaseError(
                f"case {case.name}: check.invariants: {unknown[0]!r} is not an invariant; "
                f"accepted: {', '.join(INVARIANTS)}"
            )
        cutoff = table.get("cutoff")
        return cls(invariants, None if cutoff is None else float(cutoff))


def check_variant(
    case: Case,
    variant: str,
    out: Path | None = None,
    examples: int = DEFAULT_EXAMPLES,
    settings_: Sequence[str] = SETTINGS,
    trained: bool = False,
    on_row: Callable[[CheckRow], None] | None = None,
    plugins: Sequence[str] = (),
    properties: Sequence[str] = PROPERTIES,
    dataset: Dataset | None = None,
) -> list[CheckRow]:
    """Each of ``properties`` of ``variant`` on ``case`` (``trained``: on the weights its first run
    ends with), in ``settings_``; each row also passed to ``on_row`` as it is made. With
    ``out``, each failing batch is written to ``<out>/<case>.check/`` as a case naming
    ``plugins`` (absolute paths: ``sweep.case_file.absolute_plugins``). ``dataset``: the
    case's first data set, if already built (``case_datasets``)."""
    get_variant(variant)
    dataset = dataset if dataset is not None else case_datasets(case)[0]
    config = first_config(case, variant)
    subject = _subject(variant, dataset, config, trained)
    declared = Declared.of(case)
    domain = Domain.of(dataset)
    predicates = property_predicates(domain, declared)
    rows = []
    for name in sorted(properties, key=PROPERTIES.index):
        if name != "step" and not subject.drawn:
            # The step saw the weights as built; every invariant holds for any weights.
            subject.draw_zero_weights()
        for setting in settings_:
            row, graphs = _check(
                subject, case, name, predicates[name], setting, declared, domain, examples
            )
            if graphs is not None and out is not None:
                row = _written(row, graphs, subject, case, out, plugins)
            rows.append(row)
            if on_row is not None:
                on_row(row)
    return rows


def first_config(case: Case, variant: str) -> TrainConfig:
    """The settings of the variant's first run in ``case`` (its first seed, batch size and
    learning rate), or the case's first run's with the variant's name if it is not listed."""
    configs = list(run_configs(case))
    if not configs:
        raise StabilityError(f"case {case.name}: no run to take the settings from")
    return next((c for v, c in configs if v == variant), configs[0][1])


def property_predicates(domain: Domain, declared: Declared) -> dict[str, Predicate]:
    return {
        "step": step,
        "node_permutation": node_permutation,
        "edge_order": edge_order,
        "batch_independence": batch_independence,
        "edge_continuity": edge_continuity(domain.low, domain.high, declared.cutoff),
        "dtype_agreement": dtype_agreement,
        "attention_normalization": attention_normalization,
    }


def _subject(variant: str, dataset: Dataset, config: TrainConfig, trained: bool) -> Subject:
    if not trained:
        return Subject.build(variant, dataset, config)
    trainer = Trainer(get_variant(variant), dataset, config)
    trainer.run()  # the guard keeps the last finite weights if the run fails
    assert trainer.recipe is not None
    return Subject(variant, dataset, config, trainer.recipe)


def _check(
    subject: Subject,
    case: Case,
    name: str,
    predicate: Predicate,
    setting: str,
    declared: Declared,
    domain: Domain,
    examples: int,
) -> tuple[CheckRow, list[Graph] | None]:
    """The property's row, and the failing batch (None if it passed)."""
    started = time.perf_counter()
    base = {"case": case.name, "variant": subject.variant, "property": name, "setting": setting}
    skipped = _skipped(subject, name, declared)
    if skipped is not None:
        return CheckRow(**base, status=skipped[0], detail=skipped[1]), None
    if setting == OWN_DATA:
        found, tried = _own_data(subject, name, predicate)
    else:
        search = SEARCH.get(name, predicate)
        found, tried = _generated(subject, search, predicate, domain, examples)
    seconds = time.perf_counter() - started
    if found is None:
        return CheckRow(**base, status=PASS, examples=tried, seconds=seconds), None
    graphs, violation = found
    row = CheckRow(
        **base,
        status=FAIL,
        detail=violation.detail,
        stage=violation.stage,
        layer=violation.layer,
        op=violation.op,
        cause=violation.cause,
        deviation=violation.deviation,
        tolerance=violation.tolerance,
        graphs=len(graphs),
        nodes=sum(g.num_nodes for g in graphs),
        examples=tried,
        seconds=seconds,
    )
    return row, graphs


def _skipped(subject: Subject, name: str, declared: Declared) -> tuple[str, str] | None:
    if name != "step" and name not in declared.invariants:
        return NOT_DECLARED, "the case's [check] invariants leave it out"
    if name == "attention_normalization" and not subject.exposes_attention:
        return NOT_APPLICABLE, "the model does not expose its attention"
    if name == "dtype_agreement" and subject.config.dtype == "float64":
        return NOT_APPLICABLE, "the model is float64 already"
    if name == "dtype_agreement":
        try:
            subject.float64_twin()
        except ModelError as exc:
            return NOT_APPLICABLE, f"the model {exc}"
    return None


Found = tuple[list[Graph], Violation]


def _own_data(subject: Subject, name: str, predicate: Predicate) -> tuple[Found | None, int]:
    """The first batch of the case's data (in order, train then validation) that fails."""
    data = subject.dataset
    graphs = data.train + data.val
    size = subject.config.batch_size
    batches = [graphs[i : i + size] for i in range(0, len(graphs), size)]
    if name != "step":
        batches = batches[:OWN_BATCHES]
    for tried, batch in enumerate(batches, start=1):
        violation = predicate(subject, batch)
        if violation is not None:
            return (batch, violation), tried
    return None, len(batches)


def _generated(
    subject: Subject, search: Predicate, predicate: Predicate, domain: Domain, examples: int
) -> tuple[Found | None, int]:
    """The smallest generated batch that fails ``search``, after at most ``examples`` tries,
    with what ``predicate`` says of it (``search`` may be a cheaper form of it)."""
    calls, first = 0, 0

    def fails(graphs: list[Graph]) -> bool:
        nonlocal calls, first
        calls += 1
        failed = search(subject, graphs) is not None
        if failed and not first:
            first = calls
        return failed

    rules = settings(
        max_examples=examples,
        database=None,
        deadline=None,
        derandomize=True,
        phases=(Phase.generate, Phase.shrink),
        suppress_health_check=list(HealthCheck),
    )
    try:
        graphs = find(domain.graph_lists(), fails, settings=rules, random=Random(HYPOTHESIS_SEED))
    except NoSuchExample:
        return None, calls
    violation = predicate(subject, graphs)
    assert violation is not None, "a shrunk counterexample passed when checked again"
    # The inputs tried until the first failure: how long shrinking took to a smaller one can
    # depend on the time Hypothesis' shrinker allows itself, and is not reported.
    return (list(graphs), violation), first


def _written(
    row: CheckRow,
    graphs: list[Graph],
    subject: Subject,
    case: Case,
    out: Path,
    plugins: Sequence[str],
) -> CheckRow:
    """Write the failing batch as a case, ``<out>/<case>.check/<variant>.<property>.<setting>
    .toml``; ``row`` with its path. The case's data repeats the batch's first graph as its
    validation graph (a data set needs one), and trains the batch as one batch."""
    setting = row.setting.replace(" ", "_")
    path = out / f"{case.name}.check" / f"{row.variant}.{row.property}.{setting}.toml"
    config = replace(subject.config, batch_size=len(graphs), epochs=1)
    comment = [
        f"Written by `python -m stability check` from case {case.name!r}: {row.variant} fails",
        f"{row.property} on these {len(graphs)} graphs ({row.setting}): {row.detail}"[:200],
    ]
    description = f"{row.variant} fails {row.property} on {len(graphs)} graphs of case {case.name}"
    written = write_data_case(
        [*graphs, graphs[0]],
        path,
        comment,
        description,
        row.variant,
        config,
        1 / (len(graphs) + 1),
        plugins,
    )
    return replace(row, counterexample=str(written))


def check_bug(case_path: str, variant: str) -> dict:
    """The zoo's score of the check on one bug (a plain dict, picklable across processes):
    for each setting, whether any property failed, which ones, the first failing row's
    stage and op, and the seconds until that first failure (building the model included;
    the whole check's when nothing failed)."""
    case = load_case(case_path)
    scored = {}
    for setting in SETTINGS:
        started = time.perf_counter()
        rows = check_variant(case, variant, settings_=[setting])
        failing = [r for r in rows if r.failed]
        build = time.perf_counter() - started - sum(r.seconds for r in rows)
        before = list(itertools.takewhile(lambda r: not r.failed, rows))
        until = rows[: len(before) + 1] if failing else rows
        scored[setting] = {
            "detected": bool(failing),
            "properties": [r.property for r in failing],
            "stage": failing[0].stage if failing else None,
            "op": failing[0].op if failing else None,
            "seconds": build + sum(r.seconds for r in until),
        }
    return scored


def check_in_worker(
    case_path: str,
    overrides: Sequence[str],
    plugins: Sequence[str],
    variant: str,
    **options: object,
) -> list[CheckRow]:
    """``check_variant`` in a worker process: the case loaded again there (its plugins
    imported), the command line's ``plugins`` too, then the variant checked."""
    from stability.core.plugins import load_plugin

    for plugin in plugins:
        load_plugin(plugin)
    case = load_case(case_path, overrides)
    return check_variant(case, variant, plugins=plugins, **options)  # type: ignore[arg-type]
