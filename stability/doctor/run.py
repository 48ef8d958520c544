"""The doctor: train a variant, name its first failure, rerun the same seeds with every
registered remedy (``stability.model.remedies``) and judge each by the written rule.

1. **The failure.** The variant trains on the case (its first batch size and learning rate,
   the seeds asked for) as ``run`` would. A run's *failure epoch* is its first failure's
   epoch (a NaN or a silent failure) or, without one, the epoch it diverged. The symptom is
   the cause of the earliest failure; ``divergence`` if it only diverged; ``headroom`` for
   runs that stayed finite but came near ``exp``'s limits (their warning).
2. **The reruns.** Every remedy trains the same seeds for ``remedy_budget`` epochs: at least
   3 times the latest failure epoch, and at least the case's budget. The op guards are
   those of the failing op and of the ops that feed it inside its layer (``producers``).
3. **The verdict** (``verdict``): ``fixes`` when no run fails within the budget (for a
   headroom symptom: and none keeps the warning); ``delays`` when the median failure epoch
   (a run without one counts as beyond the budget) is at least ``DELAY_FACTOR`` times the
   original's; else ``does not help``. A remedy that cannot apply is ``not applicable``.
4. **Ops that fail in turn** (``follow_through``): an op guard whose runs fail at another site (the
   same op in the next layer, or another op) gets a follow-up trial, the variant with that
   site guarded too, up to ``MAX_GUARDS`` guards; each is proved by its own retraining.
5. **Beyond the seeds** (``follow_through``): every remedy that fixes the original seeds trains
   ``FRESH_SEEDS`` fresh seeds too (other initial weights and batch orders; the seeds after
   the largest asked for). It ``fixes`` only if they do not fail either; else its verdict
   over all its runs is ``delays`` by the rule above, or ``holds on these seeds``.
6. **Beyond the data** (``follow_through`` with a ``push``): the fixes that held on the
   fresh seeds, in the order they are recommended, are each pushed, until one holds: the
   command line passes the hunt (``stability.explore``; the doctor imports no other
   feature), which climbs the remedied variant's own margins toward its limits, moving the
   data, for a few trainings. A fix whose failure comes back there ``holds on this data``;
   the next is pushed. A failure of another cause and site is told, not held against it
   (``judged``).

Each remedy's runs are an ordinary case in the doctor's folder (``<case>__<remedy>.csv`` and
its store), so ``--resume``, ``--workers`` and Ray work as for ``run``.
"""

from __future__ import annotations

import math
import re
import statistics
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING

from stability.core.errors import RemedyError, StabilityError
from stability.core.failures import Cause, read_cause
from stability.data import Dataset
from stability.doctor.code_fix import CodeFix, fixes_text, remedy_fixes
from stability.doctor.remedies import candidate, case_for
from stability.model.op_guard import GUARDS, LOSS_SITE, Site, guard_named
from stability.model.recipe import Recipe
from stability.model.remedies import failing_op_producers, recipe_sites
from stability.model.remedy import (
    DIVERGENCE,
    HEADROOM,
    LAYER_MARK,
    OP_GUARD,
    REMEDY_MARK,
    WEIGHT_GROWTH,
    Remedy,
    chain_parts,
    list_remedies,
    remedied_name,
)
from stability.model.variants import get_variant
from stability.report.verdicts import (
    DELAYS,
    DOES_NOT_HELP,
    FIXES,
    HOLDS_ON_THESE_SEEDS,
    HOLDS_ON_THIS_DATA,
    NOT_APPLICABLE,
    delays,
)
from stability.sweep.cases import Case
from stability.sweep.runner import (
    check_same_data,
    config_key,
    execute_runs,
    prepared,
    run_configs,
    source_datasets,
)
from stability.sweep.store import RunStore
from stability.sweep.workers import kept_pools
from stability.train.probe import error_line
from stability.train.run_summary import RowSettings, headroom_warning
from stability.train.trainer import Trainer

if TYPE_CHECKING:
    from stability.sweep.ray_executor import RayCluster

#: The names of the op guards (``guard_sqrt``...): the remedies a chain's parts may be.
GUARD_NAMES = frozenset(g.name for g in GUARDS)
#: The rerun budget is at least this many times the latest original failure epoch.
BUDGET_FACTOR = 3

#: The classes of fix from the most local change to the least: a guard changes one op, a
#: reformulation one layer's formula, an architecture change the model, an optimizer
#: setting every update, data cleaning what every graph says, and the dtype every op and
#: the cost of each. The doctor recommends the most local fix, as a maintainer would patch
#: the failing line before changing the model, the training or the data.
LOCALITY = (
    OP_GUARD,
    "stable reformulation",
    "architecture change",
    "optimizer setting",
    "data cleaning",
    "dtype",
)

#: The most op guards a chain of repairs puts in one variant.
MAX_GUARDS = 3

#: How many fresh seeds a remedy that fixes the original seeds must also survive.
FRESH_SEEDS = 2
#: What a trial's fresh seeds' case is called after its own.
FRESH_MARK = "__fresh"

#: The variant as it is: the trial whose runs the failure is read from.
ORIGINAL = Remedy("original", "original", "the variant as it is", "")


Row = Mapping[str, str]


def _number(row: Row, column: str) -> float | None:
    text = str(row.get(column) or "").strip()
    if not text or text.lower() == "nan":
        return None
    return float(text)


def failure_epoch(row: Row) -> int | None:
    """The run's first failure epoch (NaN or silent), else its divergence epoch, else None."""
    epochs = [_number(row, "first_nan_epoch"), _number(row, "diverged_epoch")]
    found = [int(e) for e in epochs if e is not None]
    return min(found) if found else None


def has_headroom_warning(row: Row, jit_compile: bool = False) -> bool:
    """Whether a finite run came within the warning margin of ``exp``'s limits (under XLA,
    also above half the overflow line: ``run_summary.headroom_warning``)."""
    cfg = RowSettings(str(row.get("dtype") or "float32"), jit_compile)
    return (
        headroom_warning(_number(row, "max_exp_arg"), _number(row, "min_node_max_logit"), cfg)
        is not None
    )


def median_epoch(epochs: Sequence[int | None]) -> float:
    """The median failure epoch, a run without a failure counted as ``inf`` (beyond any
    budget); ``inf`` when at least half the runs did not fail."""
    return statistics.median([math.inf if e is None else float(e) for e in epochs])


def verdict(
    original: Sequence[int | None], remedied: Sequence[int | None], warned: Sequence[bool] = ()
) -> str:
    """The doctor's rule (module docstring) for a remedy's runs: their failure epochs
    ``remedied`` (None: no failure within the budget) against the original runs' failure
    epochs ``original``; ``warned``, for a headroom symptom, says which remedied runs kept
    the warning."""
    if not remedied:
        raise ValueError("a verdict needs at least one run")
    if all(e is None for e in remedied) and not any(warned):
        return FIXES
    before = median_epoch(original)
    if math.isfinite(before) and delays(median_epoch(remedied), before):
        return DELAYS
    return DOES_NOT_HELP


@dataclass(frozen=True)
class Finding:
    """What the original runs showed: the symptom, the earliest failing run's row (None
    when no run failed) and every run's failure epoch."""

    symptom: str | None
    first: Row | None
    epochs: tuple[int | None, ...]
    rows: tuple[Row, ...]

    @property
    def layer(self) -> str | None:
        text = str((self.first or {}).get("first_nan_layer") or "").strip()
        return text or None

    @property
    def site(self) -> str | None:
        """Where an op guard goes: the failing layer, or ``LOSS_SITE`` for a failure in the
        loss (``guard_site``)."""
        return guard_site(self.first or {})

    @property
    def ops(self) -> tuple[str, ...]:
        """The op types the failure names (``failing_ops``)."""
        return failing_ops(str((self.first or {}).get("first_nan_op") or ""))

    @property
    def table_symptom(self) -> str:
        """The symptom the doctor's table is read by: the symptom, except that a forward
        overflow at linear ops only (``LINEAR_OPS``) is ``WEIGHT_GROWTH``: no ``exp`` made
        that Inf, so the exp remedies are not what the table expects to help."""
        symptom = self.symptom or ""
        if symptom == Cause.FORWARD_OVERFLOW.value and self.ops and set(self.ops) <= LINEAR_OPS:
            return WEIGHT_GROWTH
        return symptom


#: Ops that only multiply and add what they are given: an Inf out of finite inputs at one
#: of them is a sum too large for the dtype, of grown weights or activations.
LINEAR_OPS = frozenset(
    {
        "MatMul",
        "BatchMatMulV2",
        "BatchMatMulV3",
        "BiasAdd",
        "Add",
        "AddV2",
        "AddN",
        "Sum",
        "Einsum",
        "Conv2D",
        "UnsortedSegmentSum",
    }
)

_OP_TYPE = re.compile(r"\b([A-Z]\w*) \(")
_GRADIENT_OP = re.compile(r"gradient: (\w+)")


def guard_site(row: Row) -> str | None:
    """Where a guard of ``row``'s failing op goes: its layer, or ``LOSS_SITE`` when it
    failed in the loss (a function, in no layer); None when neither is known."""
    layer = str(row.get("first_nan_layer") or "").strip()
    if layer:
        return layer
    return LOSS_SITE if row.get("first_nan_where") == "loss" else None


def failing_ops(text: str) -> tuple[str, ...]:
    """The op types in a row's ``first_nan_op``: ``Sqrt (Sqrt) gradient: SqrtGrad`` names
    ``Sqrt``; ``ConcatV2 (concat) gradient: SqrtGrad`` names ``ConcatV2`` and the ``Sqrt``
    whose gradient failed (a gradient op ``XGrad`` is ``X``'s)."""
    found = _OP_TYPE.findall(text)
    found += [op.removesuffix("Grad") for op in _GRADIENT_OP.findall(text)]
    return tuple(dict.fromkeys(found))


def find(rows: Sequence[Row], jit_compile: bool = False) -> Finding:
    """The ``Finding`` of the original runs' rows (of a case with ``jit_compile`` or not)."""
    epochs = tuple(failure_epoch(row) for row in rows)
    failing = [(e, i) for i, e in enumerate(epochs) if e is not None]
    spoilt = [row for row in rows if read_cause(row) is Cause.INPUT]
    if spoilt:  # the data holds NaN or Inf: such a run never trained, so it has no epoch
        return Finding(Cause.INPUT.value, spoilt[0], epochs, tuple(rows))
    if failing:
        first = rows[min(failing)[1]]
        cause = read_cause(first)
        if cause is Cause.INPUT:
            return Finding(Cause.INPUT.value, first, epochs, tuple(rows))
        symptom = DIVERGENCE if cause is Cause.NONE else cause.value
        return Finding(symptom, first, epochs, tuple(rows))
    warned = [row for row in rows if has_headroom_warning(row, jit_compile)]
    if warned:
        return Finding(HEADROOM, warned[0], epochs, tuple(rows))
    return Finding(None, None, epochs, tuple(rows))


def remedy_budget(finding: Finding, case_epochs: int) -> int:
    """The reruns' epochs: ``BUDGET_FACTOR`` times the latest failure epoch, and never fewer
    than the case's own budget (a fix must last as long as a finite run of the case)."""
    failed = [e for e in finding.epochs if e is not None]
    return max(BUDGET_FACTOR * max(failed) if failed else 0, case_epochs)


@dataclass
class Trial:
    """One remedy on the case: its case (None when it cannot apply, ``reason`` says why),
    the folder its store is in, and its runs' rows once trained."""

    remedy: Remedy
    case: Case | None
    folder: Path = Path(".")
    reason: str = ""
    rows: list[Row] = field(default_factory=list)
    #: For an op guard: the ops it rewrote when the remedied variant was checked, each with
    #: the user's line that built it (``stability.model.op_guard.Site``).
    sites: list[Site] = field(default_factory=list)
    #: The runs on fresh seeds (``confirmations``), once trained: only a fix has them.
    fresh: Trial | None = None
    #: What pushing its data toward its limits did (``push_fixes``): only a fix that held
    #: on the fresh seeds is pushed, in the order of the recommendation, until one holds.
    pushed: Pushed | None = None
    #: Whether ``follow_ups`` has looked at this trial's failure already.
    followed: bool = False

    @property
    def epochs(self) -> list[int | None]:
        return [failure_epoch(row) for row in self.rows]

    def verdict(self, finding: Finding) -> str:
        if self.case is None or not self.rows:
            return NOT_APPLICABLE
        found = self._verdict(finding, self.rows)
        if found != FIXES or self.fresh is None or not self.fresh.rows:
            return found
        every = [*self.rows, *self.fresh.rows]
        if self._verdict(finding, every) == FIXES:
            if self.pushed is not None and self.pushed.breaks_fix:
                return HOLDS_ON_THIS_DATA
            return FIXES
        epochs = [failure_epoch(row) for row in every]
        return (
            DELAYS
            if delays(median_epoch(epochs), median_epoch(finding.epochs))
            else (HOLDS_ON_THESE_SEEDS)
        )

    def _verdict(self, finding: Finding, rows: Sequence[Row]) -> str:
        jit = self.case.jit_compile
        headroom = finding.symptom == HEADROOM
        warned = [has_headroom_warning(r, jit) for r in rows] if headroom else []
        return verdict(finding.epochs, [failure_epoch(r) for r in rows], warned)

    def final_mae(self) -> float | None:
        """The median final MAE of the runs that have one."""
        values = [v for v in (_number(r, "final_mae") for r in self.rows) if v is not None]
        return statistics.median(values) if values else None


@dataclass
class DoctorRun:
    """A doctor's whole work: the case as diagnosed, the finding, the budget and trials."""

    case: Case
    variant: str
    original: Trial
    finding: Finding
    budget: int = 0
    trials: list[Trial] = field(default_factory=list)
    #: For a failure in the input data: ``(graph, field)`` of every graph holding NaN or
    #: +-Inf, and how many graphs the data has.
    bad_input: list[tuple[str, str]] = field(default_factory=list)
    num_graphs: int = 0
    #: The fixes whose data was pushed toward their limits, in the order they were pushed.
    pushed: list[Trial] = field(default_factory=list)
    #: The types of the ops that feed the failing op in its layer (``producers``).
    producer_ops: tuple[str, ...] = ()

    def fixes(self) -> list[Trial]:
        """The trials that fix the failure, the recommended first (``recommendation``)."""
        fixed = [t for t in self.trials if t.verdict(self.finding) == FIXES]
        return sorted(fixed, key=self.recommendation)

    def keeps_accuracy(self, trial: Trial) -> bool:
        """Whether a fix ends at or below the original runs' best MAE before they failed
        (True when they never validated: there is nothing to compare with)."""
        best, mae = self.original_best_mae(), trial.final_mae()
        return best is None or (mae is not None and mae <= best)

    def recommendation(self, trial: Trial) -> tuple:
        """The order of the fixes: those that keep the accuracy first, then the most local
        change (``LOCALITY``: the failing op before the whole model, the data or the
        dtype; a guard of the failing op before a guard of only the ops that feed it; one
        guard before a chain of them), then the lowest median final MAE."""
        mae = trial.final_mae()
        return (
            not self.keeps_accuracy(trial),
            LOCALITY.index(trial.remedy.fix_class),
            trial.remedy.is_op_guard and not self.guards_failing_op(trial),
            trial.remedy.name.count(REMEDY_MARK),
            mae is None,
            mae or 0.0,
        )

    def guards_failing_op(self, trial: Trial) -> bool:
        """Whether an op guard's trial (or one of its chain, ``guard_a+guard_b@layer``)
        guards an op of the type the failure names, not only the ops that feed it."""
        guards = chain_parts(trial.remedy.name)
        named = set(self.finding.ops)
        return any(named & set(guard_named(g).op_types) for g in guards if g in GUARD_NAMES)

    def recommended(self) -> Trial | None:
        fixes = self.fixes()
        return fixes[0] if fixes else None

    def code_fixes(self, trial: Trial) -> list[CodeFix]:
        """The lines of the user's code an op guard's trial rewrites, before and after, with
        the case dtype's bounds written out; none for another remedy."""
        return remedy_fixes(trial.remedy, trial.sites, self.original.case.dtype)

    def code_fix_text(self, trial: Trial | None) -> str:
        """``file:line: before => after`` for each line ``code_fixes`` gives, `` | ``-joined."""
        fixes = self.code_fixes(trial) if trial is not None else []
        return fixes_text(fixes)

    def original_best_mae(self) -> float | None:
        """The median over the original runs of their best MAE before any failure."""
        values = [v for v in (_number(r, "best_mae") for r in self.original.rows) if v is not None]
        return statistics.median(values) if values else None


def diagnosed_case(case: Case, variant: str, seeds: Sequence[int] | None) -> Case:
    """``case`` cut to the doctor's runs: ``variant``, ``seeds`` (default: the case's), the
    case's first batch size and learning rate."""
    get_variant(variant)  # an unknown name is one line before any training
    return replace(
        case,
        name=f"{case.name}__original",
        variants=(variant,),
        seeds=tuple(seeds) if seeds else case.seeds,
        batch_sizes=case.batch_sizes[:1],
        learning_rates=case.learning_rates[:1],
    )


def plan(run: DoctorRun, candidates: Sequence[str] = ()) -> list[Trial]:
    """Every remedy's trial on the diagnosed case, each checked by building its variant on
    the data (``applied_target``): one that cannot apply gets its reason, and no runs."""
    base = replace(run.original.case, epochs=run.budget)
    stem = run.case.name
    run.producer_ops = producers(run)
    trials = []
    for remedy in (*list_remedies(), *(candidate(name) for name in candidates)):
        name = f"{stem}__{remedy.name.replace(':', '_')}"
        try:
            where = run.finding.site if remedy.is_op_guard else run.finding.layer
            remedied = case_for(remedy, base, run.variant, where, name)
            target = applied_target(remedy, base, remedied, run.finding.ops, run.producer_ops)
        except RemedyError as exc:
            trials.append(Trial(remedy, None, run.original.folder, str(exc)))
            continue
        except StabilityError as exc:
            if remedy.family == "candidate":
                raise  # the user's own variant: a bad one is bad input
            trials.append(Trial(remedy, None, run.original.folder, str(exc)))
            continue
        sites = recipe_sites(target.recipe()) if remedy.is_op_guard else []
        trials.append(Trial(remedy, remedied, run.original.folder, sites=sites))
    return trials


def producers(run: DoctorRun) -> tuple[str, ...]:
    """The types of the ops that feed the failing op inside the failing layer, nearest
    first: the guards of those ops are tried too, as RANUM guards an op's inputs, because a
    failure often shows one op after its cause (the 0 / 0 of a softmax whose ``exp`` terms
    all underflowed; the log-sum-exp whose empty segment's max is the lowest float). For
    weights that do not sum to 1 (no op named), every op type the layer builds. None
    without a failing layer and op (a loss, an optimizer, the data)."""
    layer, ops = run.finding.site, run.finding.ops
    # Weights that do not sum to 1 name their layer and no op: every op of the layer that
    # computes them is a candidate, so the guards of all its op types are tried.
    normalization = run.finding.symptom == Cause.NORMALIZATION.value
    if not layer or not (ops or normalization) or run.original.case is None:
        return ()
    target = _Target(run.original.case, run.original.case, ops)
    try:
        return failing_op_producers(target, layer, ops)
    except StabilityError:
        return ()


#: Data sets already built, by what builds them: every remedy of a doctor (and every doctor
#: of the zoo) trains on its case's data, and a generated data set takes seconds to draw.
_BUILT: dict[tuple, list[Dataset]] = {}


def case_datasets(case: Case) -> list[Dataset]:
    """``runner.case_datasets`` of ``case``, each data set built once per process."""
    params = tuple(sorted((k, repr(v)) for k, v in case.dataset_params.items()))
    source = (case.dataset, params, case.num_datasets, case.allow_nonfinite_input)
    if source not in _BUILT:
        _BUILT[source] = source_datasets(case)
    key = (*source, case.self_loops, case.edge_transform)
    if key not in _BUILT:
        _BUILT[key] = [prepared(d, case) for d in _BUILT[source]]
    return _BUILT[key]


@dataclass
class _Target:
    """A remedy's trial as its predicate sees it (``stability.model.remedy.Target``): the
    case before and after the remedy, their data (each built once), and the remedied
    variant built on the first data set as its first run would be."""

    before: Case
    after: Case
    failing_ops: tuple[str, ...] = ()
    producer_ops: tuple[str, ...] = ()
    _recipe: Recipe | None = None

    @property
    def learning_rate(self) -> float:
        (_, config), *_ = run_configs(self.after)
        return config.learning_rate

    def data_before(self) -> list[Dataset]:
        return case_datasets(self.before)

    def data_after(self) -> list[Dataset]:
        return case_datasets(self.after)

    def recipe(self) -> Recipe:
        """The remedied variant, built once (``RemedyError``, saying why, when it cannot be)."""
        if self._recipe is None:
            (variant, config), *_ = run_configs(self.after)
            try:
                self._recipe = Trainer(get_variant(variant), self.data_after()[0], config).build()
            except StabilityError as exc:
                raise RemedyError(str(exc)) from None
            except Exception as exc:  # the user's builder code: any error is a bad variant
                raise RemedyError(f"{type(exc).__name__}: {exc}") from exc
        return self._recipe


def trial_target(case: Case) -> _Target:
    """``case`` as a remedy's predicate sees it, unremedied (no failing op named)."""
    return _Target(case, case)


def applied_target(
    remedy: Remedy,
    before: Case,
    after: Case,
    failing_ops: tuple[str, ...] = (),
    producer_ops: tuple[str, ...] = (),
) -> _Target:
    """Ask ``remedy`` whether it applies (its own predicate), then build the remedied
    variant on the remedied data, as its first run would; the target, built."""
    target = _Target(before, after, failing_ops, producer_ops)
    reason = remedy.why_not(target)
    if reason is not None:
        raise RemedyError(reason)
    target.recipe()
    return target


def train_trials(
    trials: Sequence[Trial],
    progress: bool,
    resume: bool,
    overwrite: bool,
    workers: int,
    cluster: RayCluster | None,
    desc: str,
    tolerate: bool = False,
) -> None:
    """Train every applicable trial's runs at once (one sweep over all of them, so
    ``workers`` stay busy across trials), each into its own store in its folder, and read
    back every trial's rows for the seeds asked for (resumed runs included). The trials
    may belong to several doctors (the zoo's). With ``tolerate``, a run that raises (a
    remedied variant whose step cannot be traced, say) makes its trial not applicable, with
    the error, instead of ending the sweep."""
    active = [t for t in trials if t.case is not None]
    stores: dict[str, RunStore] = {}
    configs, all_datasets = [], []
    try:
        for trial in active:
            case = trial.case
            datasets = case_datasets(case)
            settings = {"epochs": case.epochs, "dtype": case.dtype}
            store = RunStore(trial.folder, case.name, resume, settings, overwrite)
            stores[_store_key(trial)] = store
            check_same_data(store, datasets)
            all_datasets += datasets
            configs += [
                (dataset, variant, config)
                for dataset in datasets
                for variant, config in run_configs(case)
                if config_key(variant, config, dataset) not in store.done
            ]
        ordered = _longest_first(configs)
        broken: dict[tuple[str, str], str] = {}

        def on_error(index: int, exc: Exception) -> None:
            _, variant, config = ordered[index]
            broken[(config.case, variant)] = f"it fails to train: {error_line(exc)}"

        execute_runs(
            ordered,
            all_datasets,
            progress,
            lambda result: stores[(result.case, result.variant)].add(result),
            desc,
            workers,
            cluster,
            on_error if tolerate else None,
        )
        for trial in active:
            wanted = {str(s) for s in trial.case.seeds}
            rows = stores[_store_key(trial)].rows()
            names = set(trial.case.variants)
            trial.rows = [r for r in rows if r["seed"] in wanted and r["variant"] in names]
            if _store_key(trial) in broken:
                trial.reason, trial.case, trial.rows = broken[_store_key(trial)], None, []
    finally:
        for store in stores.values():
            store.finish()


def _store_key(trial: Trial) -> tuple[str, str]:
    """A trial's runs by their rows' case and variant (unique across the zoo's doctors)."""
    return trial.case.name, trial.case.variants[0]


def _longest_first(configs: list) -> list:
    """float64 runs first: they are the slowest, so the last runs to start are short ones
    and no worker idles at the end (the rows do not depend on the order)."""
    return sorted(configs, key=lambda c: c[2].dtype != "float64")


def _first_failing(trial: Trial) -> Row | None:
    failing = [(e, i) for i, e in enumerate(trial.epochs) if e is not None]
    return trial.rows[min(failing)[1]] if failing else None


def follow_ups(run: DoctorRun) -> list[Trial]:
    """For every op guard trial (or chain) whose runs failed at a site a guard can treat
    and that it does not guard yet, the trial with that site guarded too, checked as
    ``plan`` checks a remedy; not yet trained."""
    made = []
    for trial in [t for t in run.trials if t.remedy.is_op_guard and t.case]:
        row = _first_failing(trial)
        variant = trial.case.variants[0]
        if row is None or trial.followed or variant.count(REMEDY_MARK) >= MAX_GUARDS:
            continue
        trial.followed = True
        layer = guard_site(row)
        ops = failing_ops(str(row.get("first_nan_op") or ""))
        for remedy in [r for r in list_remedies() if r.is_op_guard]:
            step = remedied_name("", remedy.name, layer if remedy.takes_layer else None)
            if step.removeprefix(REMEDY_MARK) in variant.split(REMEDY_MARK)[1:]:
                continue  # that site is guarded already, and failed again
            made += _follow_up(run, trial, remedy, step, ops)
    run.trials += made
    return made


def _follow_up(run: DoctorRun, trial: Trial, remedy: Remedy, step: str, ops: tuple[str, ...]):
    """``trial``'s variant with ``step`` (``+guard@layer``) added, as a trial: none when the
    guard does not apply there."""
    name = f"{trial.remedy.name}{step}"
    case = replace(
        trial.case,
        name=f"{run.case.name}__{name.replace(':', '_')}",
        variants=(trial.case.variants[0] + step,),
    )
    try:
        target = applied_target(remedy, trial.case, case, ops)
    except StabilityError:
        return []
    sites = recipe_sites(target.recipe())
    if {_place(s) for s in sites} <= {_place(s) for s in trial.sites}:
        return []  # the layer is guarded already, as one of the guarded layer's class
    place = step.partition(LAYER_MARK)[2] or "the model"
    label = f"{trial.remedy.label}, then {remedy.label} in {place}"
    chained = replace(remedy, name=name, label=label)
    return [Trial(chained, case, trial.folder, sites=sites)]


def _place(site: Site) -> tuple:
    """Where a guard rewrote an op: the guard, the op type and the user's code position."""
    return (site.guard, site.op_type, site.file, site.line, site.col)


def fresh_seeds(seeds: Sequence[int]) -> tuple[int, ...]:
    """The ``FRESH_SEEDS`` seeds after the largest of ``seeds``."""
    top = max(seeds)
    return tuple(range(top + 1, top + 1 + FRESH_SEEDS))


def confirmations(runs: Sequence[DoctorRun]) -> list[Trial]:
    """For every trial that fixes the original seeds, its fresh seeds' trial (attached to
    it as ``fresh``), not yet trained."""
    made = []
    for run in runs:
        for trial in run.trials:
            if trial.case is None or trial.verdict(run.finding) != FIXES:
                continue
            case = replace(
                trial.case,
                name=trial.case.name + FRESH_MARK,
                seeds=fresh_seeds(trial.case.seeds),
            )
            trial.fresh = Trial(trial.remedy, case, trial.folder)
            made.append(trial.fresh)
    return made


@dataclass(frozen=True)
class Pushed:
    """What pushing a fix's data toward its limits did: whether a run on the pushed data
    failed, in words (where it failed and on what data, or why it was not pushed), and the
    case file that trains the data it failed on (None: it did not fail)."""

    failed: bool
    text: str
    path: Path | None = None
    #: Whether the data could be pushed at all (a data set the push cannot move: False).
    tried: bool = True
    #: Where the pushed run failed (``first_nan_where``, ``first_nan_layer``) and why
    #: (``failure_cause``); None where it did not fail.
    stage: str | None = None
    layer: str | None = None
    cause: str | None = None
    #: Whether that failure is another than the one the fix treats (``judged``).
    another: bool = False

    @property
    def breaks_fix(self) -> bool:
        """Whether the pushed data brought back the failure the fix treats."""
        return self.failed and not self.another


#: ``push(case, folder)``: push the data of ``case`` (a fix's, one variant) toward the
#: limits of its variant, writing what breaks it into ``folder``.
Push = Callable[[Case, Path], Pushed]


def push_fixes(run: DoctorRun, push: Push) -> list[Trial]:
    """Push the fixes of ``run`` (``fixes``: those that held on the fresh seeds, the
    recommended first) one by one until one holds; the pushed trials, in order."""
    for trial in run.fixes():
        trial.pushed = judged(run.finding, push(trial.case, trial.folder))
        run.pushed.append(trial)
        if trial.pushed.tried and not trial.pushed.breaks_fix:
            break
    return run.pushed


def judged(finding: Finding, pushed: Pushed) -> Pushed:
    """``pushed``, marked ``another`` when its failure is not the one ``finding`` names:
    another cause, at another stage or layer. A fix is a change for one failure; data pushed
    far enough breaks any model somewhere (raw distances of 400 make the gradients of the
    dense layer that reads them explode, whatever the softmax after it does), and a remedy
    that transforms the distances is not pushed at all, so such a failure is reported, not
    held against the fix."""
    if not pushed.failed or (pushed.cause is None and pushed.stage is None):
        return pushed  # nothing says that the failure is another
    first = finding.first or {}
    original = (first.get("first_nan_where"), first.get("first_nan_layer"))
    same_cause = pushed.cause is not None and pushed.cause == first.get("failure_cause")
    if same_cause or (pushed.stage, pushed.layer) == original:
        return pushed
    was = _failure_words(first.get("failure_cause"), *original)
    now = _failure_words(pushed.cause, pushed.stage, pushed.layer)
    text = (
        f"{pushed.text}: another failure ({now}) than the one it fixes ({was}), not held against it"
    )
    return replace(pushed, another=True, text=text)


def _failure_words(cause: object, stage: object, layer: object) -> str:
    """``cause`` in ``stage`` at ``layer``, each where known."""
    parts = [str(cause or "no cause named")]
    parts += [f"in {stage}"] if stage else []
    parts += [f"at {layer}"] if layer else []
    return " ".join(parts)


#: ``train(trials, desc)``: ``train_trials`` with a doctor's sweep options bound, a run that
#: raises making its trial not applicable.
Train = Callable[[Sequence[Trial], str], None]


def tolerant(
    progress: bool, resume: bool, overwrite: bool, workers: int, cluster: RayCluster | None
) -> Train:
    """``train_trials`` with these options bound, tolerating a run that raises."""

    def train(trials: Sequence[Trial], desc: str) -> None:
        train_trials(trials, progress, resume, overwrite, workers, cluster, desc, tolerate=True)

    return train


def follow_through(
    runs: Sequence[DoctorRun],
    train: Train,
    say: Callable[[str], None],
    push: Push | None = None,
) -> None:
    """After the remedies' runs: repair ops that fail in turn (``follow_ups``), one
    retraining per round, then train every fix's fresh seeds (``confirmations``), then,
    with ``push``, push the fixes that held on them (``push_fixes``), so that each verdict
    covers them."""
    for _ in range(MAX_GUARDS - 1):
        made = [t for run in runs for t in follow_ups(run)]
        if not made:
            break
        say(f"guarding the next failing op: {len(made)} chained trials")
        train(made, "chained")
    fresh = confirmations(runs)
    if fresh:
        seeds = ", ".join(map(str, fresh[0].case.seeds))
        say(f"confirming {len(fresh)} fixes on fresh seeds ({seeds} for the first)")
        train(fresh, "fresh")
    if push is None:
        return
    for run in runs:
        if run.fixes():
            say(f"pushing the data of {run.variant}'s fixes toward their limits")
        for trial in push_fixes(run, push):
            say(f"{trial.remedy.name}: {trial.pushed.text}")


def begin(case: Case, variant: str, out: Path, seeds: Sequence[int] | None = None) -> DoctorRun:
    """A doctor of ``variant`` on ``case`` whose runs go to ``out``: its original trial,
    checked (built on the data), not yet trained."""
    original_case = diagnosed_case(case, variant, seeds)
    applied_target(ORIGINAL, original_case, original_case)
    original = Trial(ORIGINAL, original_case, out)
    return DoctorRun(case, variant, original, find([]))


def conclude(run: DoctorRun, candidates: Sequence[str] = ()) -> None:
    """Read the trained original runs: the finding, and, for a failure a remedy can treat,
    the budget and every remedy's trial."""
    run.finding = find(run.original.rows, run.case.jit_compile)
    if run.finding.symptom == Cause.INPUT.value:
        datasets = case_datasets(run.original.case)
        run.bad_input = [bad for data in datasets for bad in data.nonfinite_graphs()]
        run.num_graphs = sum(len(d.train) + len(d.val) for d in datasets)
        return
    if run.finding.symptom is None:
        return
    run.budget = remedy_budget(run.finding, run.case.epochs)
    run.trials = plan(run, candidates)


def doctor(
    case: Case,
    variant: str,
    out: Path,
    seeds: Sequence[int] | None = None,
    candidates: Sequence[str] = (),
    progress: bool = True,
    resume: bool = False,
    overwrite: bool = False,
    workers: int = 1,
    cluster: RayCluster | None = None,
    on_stage: Callable[[str], None] | None = None,
    push: Push | None = None,
) -> DoctorRun:
    """Diagnose ``variant`` on ``case``, then train and judge every remedy (module docstring).
    The runs go to ``out`` (one store per trial); ``push`` makes the data the fixes are
    tried on beyond the case's own (none: they are not)."""
    say = on_stage or (lambda text: None)
    for name in candidates:
        get_variant(name)
    run = begin(case, variant, out, seeds)
    seeds_text = ", ".join(map(str, run.original.case.seeds))
    say(f"training {variant} on {case.name}: seeds {seeds_text}, {case.epochs} epochs")
    with kept_pools():  # one start of the workers for every stage
        train_trials([run.original], progress, resume, overwrite, workers, cluster, variant)
        conclude(run, candidates)
        if run.trials:
            applicable = sum(t.case is not None for t in run.trials)
            say(f"{run.finding.symptom}: rerunning {applicable} remedies for {run.budget} epochs")
            train = tolerant(progress, resume, overwrite, workers, cluster)
            train(run.trials, "remedies")
            follow_through([run], train, say, push)
    return run


def doctor_many(
    requests: Sequence[tuple[Case, str, Path]],
    progress: bool = True,
    resume: bool = False,
    overwrite: bool = False,
    workers: int = 1,
    on_stage: Callable[[str], None] | None = None,
    push: Push | None = None,
) -> list[DoctorRun]:
    """A doctor for each ``(case, variant, out)``, every doctor's runs in one sweep: all the
    originals, then all the remedies, so ``workers`` stay busy across doctors (the zoo's)."""
    say = on_stage or (lambda text: None)
    runs = [begin(case, variant, out) for case, variant, out in requests]
    say(f"training {len(runs)} bugs")
    with kept_pools():  # one start of the workers for every stage
        train_trials([r.original for r in runs], progress, resume, overwrite, workers, None, "bugs")
        for run in runs:
            conclude(run)
        trials = [t for r in runs for t in r.trials]
        say(f"rerunning {sum(t.case is not None for t in trials)} remedies")
        train = tolerant(progress, resume, overwrite, workers, None)
        train(trials, "remedies")
        follow_through(runs, train, say, push)
    return runs
