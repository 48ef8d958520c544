"""--workers: runs trained in worker processes give the rows of a serial run."""

import multiprocessing
from dataclasses import replace

import pandas as pd
import pytest
from conftest import TINY_CASE

from stability.cli import main
from stability.core.errors import StabilityError
from stability.core.results import TIMING_FIELDS
from stability.model import variants
from stability.model.recipe import BuildContext, Recipe
from stability.model.variants import create_recipe, register_variant
from stability.sweep.cases import parse_case
from stability.sweep.runner import run_case
from stability.sweep.workers import kept_pools, run_in_workers, variant_modules

# Two data sets and two variants, so that four runs share two workers and can finish out of
# order, and each task must carry its own data set.
CASE = TINY_CASE.replace("epochs = 2", "epochs = 2\nnum_datasets = 2")


def untimed(results):
    rows = [{k: v for k, v in r.row().items() if k not in TIMING_FIELDS} for r in results]
    return rows, [r.history_rows() for r in results]


def children() -> set[int]:
    return {process.pid for process in multiprocessing.active_children()}


def test_two_workers_give_the_serial_rows_in_the_serial_order(tmp_path):
    """Also in workers kept for a second sweep (``kept_pools``, a doctor's stages): the same
    processes train it (one variant of the case: its runs on both data sets), to the same
    rows, and stop when the block ends."""
    case = parse_case(CASE, source="tiny")
    serial = run_case(case, tmp_path / "serial", progress=False)
    others = children()
    with kept_pools():
        parallel = run_case(case, tmp_path / "parallel", progress=False, workers=2)
        kept = children() - others
        second = replace(case, variants=("raw_e",))
        again = run_case(second, tmp_path / "again", progress=False, workers=2)
        assert len(kept) == 2, "the two workers of the first sweep were not kept"
        assert children() - others == kept, "the second sweep started other workers"
    assert not kept & children(), "the kept workers outlived the block"
    assert len({r.dataset for r in serial}) == 2, "the case must train on two data sets"
    assert len(parallel) == 4
    assert untimed(parallel) == untimed(serial)
    assert len(again) == 2
    assert untimed(again) == untimed([r for r in serial if r.variant == "raw_e"])
    for name in ("tiny.csv", "tiny.history.csv"):
        frames = [pd.read_csv(tmp_path / way / name) for way in ("serial", "parallel")]
        kept = [f.drop(columns=[c for c in TIMING_FIELDS if c in f.columns]) for f in frames]
        pd.testing.assert_frame_equal(kept[0], kept[1], obj=name)


def test_zero_workers_is_an_error():
    with pytest.raises(StabilityError, match="--workers 0"):
        run_in_workers([], 0)


@pytest.mark.parametrize("value", ["0", "-1", "two"])
def test_cli_rejects_bad_workers_with_exit_code_2(value, tmp_path, capsys):
    case = tmp_path / "tiny.toml"
    case.write_text(TINY_CASE)
    with pytest.raises(SystemExit) as exc:
        main(["run", str(case), "--workers", value, "--out", str(tmp_path)])
    assert exc.value.code == 2
    assert "--workers" in capsys.readouterr().err


def test_a_variant_from_a_script_is_refused(monkeypatch):
    """A spawned worker cannot import a script's ``__main__``, so it could not see it."""

    def builder(ctx: BuildContext) -> Recipe:
        return create_recipe(ctx)

    builder.__module__ = "__main__"
    monkeypatch.setattr(variants, "_variants", variants._variants.copy())
    register_variant(builder, name="script_only_variant")
    with pytest.raises(StabilityError, match=r"script_only_variant.*importable module"):
        variant_modules(["raw_e", "script_only_variant"])
    assert variant_modules(["raw_e", "stable_softmax"]) == ["stability.model.variants"]
