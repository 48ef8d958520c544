"""A sweep: every (learning rate, batch size, variant, seed) of a case, on each of the case's
data sets; every variant trains on the same data sets."""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

from tqdm.auto import tqdm

from stability.core.errors import StabilityError
from stability.core.results import RunResult
from stability.data import Dataset, load_dataset
from stability.data.edge_transform import transform_edges
from stability.data.self_loops import with_self_loops
from stability.model.variants import get_variant
from stability.sweep.cases import Case
from stability.sweep.settings import per_run
from stability.sweep.store import RUN_KEY, RunStore, run_key
from stability.train.config import TrainConfig
from stability.train.threads import LAYOUT, can_train_here
from stability.train.trainer import Trainer

if TYPE_CHECKING:
    from stability.sweep.ray_executor import RayCluster


def run_configs(case: Case) -> Iterator[tuple[str, TrainConfig]]:
    """(variant name, config) for every run of ``case``, in a fixed order."""
    for lr, batch_size, variant, seed in itertools.product(
        case.learning_rates, case.batch_sizes, case.variants, case.seeds
    ):
        yield (
            variant,
            TrainConfig(
                case=case.name,
                seed=seed,
                batch_size=batch_size,
                learning_rate=lr,
                threads=case.threads,
                **per_run(case),
            ),
        )


def case_datasets(case: Case) -> list[Dataset]:
    """The case's ``num_datasets`` data sets, data set k built with seed ``dataset.seed + k``,
    so the same case always gives the same data sets, shared by every variant; each with
    the case's ``self_loops`` and ``edge_transform`` applied (``prepared``)."""
    return [prepared(d, case) for d in source_datasets(case)]


def prepared(dataset: Dataset, case: Case) -> Dataset:
    """``dataset`` as ``case`` trains on it: self-loops added if asked (a loop's distance
    is 0, so they come before the distances are transformed), then ``edge_transform``."""
    looped = with_self_loops(dataset) if case.self_loops else dataset
    return transform_edges(looped, case.edge_transform)


def source_datasets(case: Case) -> list[Dataset]:
    """The case's data sets as its data set builds them, before ``edge_transform``."""
    params = {"seed": 0, **case.dataset_params}
    return [
        load_dataset(
            case.dataset,
            allow_nonfinite=case.allow_nonfinite_input,
            **{**params, "seed": params["seed"] + k},
        )
        for k in range(case.num_datasets)
    ]


def build_variants(case: Case, dataset: Dataset) -> None:
    """Build every variant of ``case`` once, as its first run would, before any training: a
    variant that cannot be built (a bad ``create_recipe`` option, say) fails at once, named,
    instead of after the variants before it have trained."""
    first = {}
    for variant, config in run_configs(case):
        first.setdefault(variant, config)
    for variant, config in first.items():
        try:
            Trainer(get_variant(variant), dataset, config).build()
        except StabilityError as exc:
            raise StabilityError(f"variant {variant!r} cannot be built: {exc}") from None
        except Exception as exc:  # the user's builder code: any error is a bad variant
            raise StabilityError(
                f"variant {variant!r} cannot be built: {type(exc).__name__}: {exc}"
            ) from exc


def run_case(
    case: Case,
    out_dir: Path | None = None,
    progress: bool = True,
    resume: bool = False,
    overwrite: bool = False,
    workers: int = 1,
    cluster: RayCluster | None = None,
) -> list[RunResult]:
    """Train every run of ``case``; with ``out_dir``, commit each run's rows to the case's
    store (``stability.sweep.store``) as soon as it finishes, whatever order runs finish
    in, so an interrupted sweep keeps every run it finished, and render ``<case>.csv`` and
    ``<case>.history.csv`` from it. With ``resume``, runs already in the store are skipped
    (and not returned); with ``overwrite``, its rows are discarded.
    ``workers > 1`` trains that many runs at once in worker processes, ``cluster`` (a
    connected ``stability.sweep.ray_executor.RayCluster``) as Ray tasks; the rows and
    their order stay those of a serial sweep (timing columns aside).

    Every run trains on the case's thread layout (``stability.train.threads``) in whichever
    process trains it; where this process's TensorFlow already started on another layout,
    the runs train in a worker process, so the rows are the same either way."""
    can_train_here(case.threads)  # pins the layout if TensorFlow has not started yet
    datasets = case_datasets(case)
    build_variants(case, datasets[0])  # before the store: a bad variant leaves no CSV behind
    store = None
    if out_dir is not None:
        settings = {"epochs": case.epochs, "dtype": case.dtype}
        store = RunStore(out_dir, case.name, resume, settings, overwrite)
    try:
        if store is not None:
            check_same_data(store, datasets)
        configs = [
            (dataset, variant, config)
            for dataset in datasets
            for variant, config in run_configs(case)
            if store is None or config_key(variant, config, dataset) not in store.done
        ]
        on_result = store.add if store is not None else None
        return execute_runs(configs, datasets, progress, on_result, case.name, workers, cluster)
    finally:
        if store is not None:  # also when interrupted: the CSVs show every finished run
            store.finish()


def execute_runs(
    configs: list[tuple[Dataset, str, TrainConfig]],
    datasets: list[Dataset],
    progress: bool,
    on_result: Callable[[RunResult], None] | None,
    desc: str,
    workers: int = 1,
    cluster: RayCluster | None = None,
    on_error: Callable[[int, Exception], None] | None = None,
) -> list[RunResult]:
    """Train ``configs`` (data set, variant, config) serially, in ``workers`` processes or
    on ``cluster``, as ``run_case`` describes; ``datasets`` number the data sets in the
    progress output. Returns the results in the order of ``configs``. ``on_error`` (not on
    a cluster) takes a run that raises, by its index, instead of ending the sweep
    (``workers.run_in_workers``).

    A serial sweep trains in this process when its TensorFlow runs the runs' thread layout
    (or can still be pinned to it), else in one worker process of that layout."""
    threads = {config.threads for _, _, config in configs} or {LAYOUT[0]}
    if len(threads) > 1:
        raise StabilityError(f"one sweep trains on one thread layout, not {sorted(threads)}")
    (intra,) = threads
    if cluster is not None or workers > 1 or not can_train_here(intra):
        from stability.sweep.workers import run_in_workers

        if cluster is not None:
            return cluster.run(configs, progress, on_result, desc, intra)
        return run_in_workers(configs, workers, progress, on_result, desc, intra, on_error)
    return _run_serially(configs, datasets, progress, on_result, desc, on_error)


def _run_serially(configs, datasets, progress, on_result, desc, on_error=None) -> list[RunResult]:
    results: list[RunResult] = []
    runs = tqdm(configs, desc=desc, unit="run", disable=not progress, dynamic_ncols=True)
    for index, (dataset, variant_name, config) in enumerate(runs):
        label = (
            f"{variant_name} seed={config.seed} bs={config.batch_size} lr={config.learning_rate:g}"
        )
        if len(datasets) > 1:
            label += f" data={position(datasets, dataset)}"
        runs.set_postfix_str(label)
        epochs = tqdm(
            total=config.epochs,
            desc="  epochs",
            unit="ep",
            leave=False,
            disable=not progress,
            dynamic_ncols=True,
        )

        def on_epoch(record, epochs=epochs):
            epochs.update(1)
            epochs.set_postfix(loss=f"{record.train_loss:.3g}", logit=f"{record.max_abs_logit:.3g}")

        try:
            result = Trainer(get_variant(variant_name), dataset, config, on_epoch).run()
        except Exception as exc:
            if on_error is None:
                raise
            on_error(index, exc)
            continue
        finally:
            epochs.close()
        if progress:
            index = position(datasets, dataset) if len(datasets) > 1 else None
            runs.write(result.summary_line(index))
        results.append(result)
        if on_result is not None:
            on_result(result)
    return results


def position(datasets: list[Dataset], dataset: Dataset) -> int:
    """``dataset``'s place in ``datasets``, by identity: data sets compare by their arrays,
    which ``==`` cannot, and a doctor's trials hold equal copies of one data set."""
    return next(i for i, d in enumerate(datasets) if d is dataset)


def check_same_data(store: RunStore, datasets: list[Dataset]) -> None:
    """Refuse to resume runs on data this case no longer builds: a data set read from a file
    carries the file's hash in its key, so an edited file is caught here."""
    held = {key[RUN_KEY.index("dataset")] for key in store.done}
    other = sorted(held - {dataset.key for dataset in datasets})
    if other:
        raise StabilityError(
            f"{store.csv} holds runs on data set {other[0]}, which this case no longer builds "
            f"(it builds {datasets[0].key}); the data or its file changed. --resume cannot mix "
            "them: pass --overwrite or choose another --out"
        )


def config_key(variant: str, config: TrainConfig, dataset: Dataset) -> tuple[str, ...]:
    """The store key of a run of ``variant`` with ``config`` on ``dataset``."""
    return run_key({**vars(config), "variant": variant, "dataset": dataset.key})
