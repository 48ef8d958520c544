"""Case files: the shipped ones validate, and malformed ones get a one-line message."""

import re
from pathlib import Path

import pytest
from conftest import TINY_CASE

from stability.core.errors import CaseError
from stability.explore.map import load_map
from stability.sweep.cases import load_case, parse_case
from stability.train.config import default_dtype

CASES = sorted((Path(__file__).parent.parent / "cases").glob("*.toml"))


@pytest.mark.parametrize("path", CASES, ids=[p.stem for p in CASES])
def test_shipped_cases_validate(path):
    # A committed case's rows were made in one dtype: under a tox dtype factor
    # (STABILITY_DTYPE) it must still train, and report, as they were made.
    assert re.search(r"^dtype\s*=", path.read_text(encoding="utf-8"), re.M), (
        f"{path.name}: name its dtype"
    )
    if "\n[map]" in path.read_text(encoding="utf-8"):  # a map case (docs/map.md)
        m = load_map(path)
        assert m.name == path.stem
        assert m.runs_per_cell >= 3, "a cell's verdict needs several runs (data sets x seeds)"
        return
    case = load_case(path)
    assert case.name == path.stem
    assert len(case.seeds) >= 3, "a verdict needs several seeds"


def test_defaults_fill_in():
    case = parse_case(TINY_CASE)
    assert case.variants == ("raw_e", "stable_softmax")
    assert case.dataset_params == {"num_graphs": 48, "min_nodes": 3, "max_nodes": 7}
    assert case.dtype == default_dtype() and case.stop_at_nan and not case.jit_compile


@pytest.mark.parametrize(
    ("text", "message"),
    [
        pytest.param("epochs = [", "not valid TOML", id="not-toml"),
        pytest.param("epoch = 10", "unknown key 'epoch'. Did you mean 'epochs'?", id="typo-key"),
        pytest.param("epochs = 0", "epochs = 0 is not valid; expected an integer > 0", id="zero"),
        pytest.param("epochs = 2.5", "epochs = 2.5 is not valid", id="float-epochs"),
        pytest.param("seeds = []", "seeds = [] is not valid; expected a non-empty", id="empty"),
        pytest.param("seeds = [-1]", "expected a non-empty list of integers >= 0", id="neg-seed"),
        pytest.param("batch_sizes = [32, true]", "batch_sizes = [32, True]", id="bool-batch"),
        pytest.param("learning_rates = [nan]", "learning_rates = [nan] is not valid", id="nan-lr"),
        pytest.param(
            'dtype = "float16"', "expected one of float32, float64, mixed_float16", id="dtype"
        ),
        pytest.param('variants = ["raw_ee"]', "Did you mean 'raw_e'?", id="variant-typo"),
        pytest.param("model = 3", "[model] must be a table", id="model-not-table"),
        pytest.param("[model]\nwidth = 3", "unknown key model.'width'", id="model-key"),
        pytest.param('[dataset]\nname = "qm9"', "dataset.name = 'qm9' is not valid", id="dataset"),
        pytest.param("[dataset]\nnum_graph = 5", "Did you mean dataset.'num_graphs'?", id="ds-key"),
        pytest.param('[dataset]\nnum_graphs = "many"', "expected a int", id="ds-type"),
        pytest.param('stop_at_nan = "yes"', "expected true or false", id="bool"),
        pytest.param("jit_compile = 1", "jit_compile = 1 is not valid; expected true or", id="jit"),
    ],
)
def test_malformed_case_gets_a_one_line_message(text, message):
    with pytest.raises(CaseError) as info:
        parse_case(text, source="bad.toml")
    text = str(info.value)
    assert text.startswith("bad.toml: "), "the message must name the file"
    assert message in text
    assert "\n" not in text, "the message must be one line"


def test_missing_file_is_named(tmp_path):
    with pytest.raises(CaseError, match="no such case file"):
        load_case(tmp_path / "absent.toml")
