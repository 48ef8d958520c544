"""Each case setting is declared once (stability.sweep.settings) and the loader, ``Case``
and the runner's ``TrainConfig`` follow the declaration."""

from __future__ import annotations

import dataclasses

import pytest

from stability.core.errors import CaseError
from stability.sweep.cases import Case, parse_case
from stability.sweep.runner import run_configs
from stability.sweep.settings import SETTINGS, TOP_LEVEL, settings_table, toml
from stability.train.config import TrainConfig

CASE_FIELDS = {f.name: f for f in dataclasses.fields(Case)}
TRAIN_FIELDS = {f.name: f for f in dataclasses.fields(TrainConfig)}
TOP_LEVEL_KEYS = {s.key for s in TOP_LEVEL}


def test_every_setting_is_a_case_field():
    assert set(SETTINGS) <= set(CASE_FIELDS)


@pytest.mark.parametrize("key", [k for k, s in SETTINGS.items() if s.per_run])
def test_a_per_run_default_is_the_trainers(key, monkeypatch):
    monkeypatch.delenv("STABILITY_DTYPE", raising=False)
    train = TRAIN_FIELDS[key]
    expected = train.default_factory() if train.default is dataclasses.MISSING else train.default
    assert getattr(parse_case(""), key) == expected


def test_every_run_gets_the_cases_per_run_settings():
    changed = {
        "epochs": 7,
        "dtype": "float64",
        "stop_at_nan": False,
        "jit_compile": True,
        "hidden": 5,
        "num_layers": 3,
    }
    assert set(changed) == {k for k, s in SETTINGS.items() if s.per_run}
    top = "".join(f"{k} = {toml(v)}\n" for k, v in changed.items() if k in TOP_LEVEL_KEYS)
    text = f'variants = ["raw_e"]\nseeds = [4]\n{top}[model]\nhidden = 5\nnum_layers = 3\n'
    ((variant, config),) = run_configs(parse_case(text))
    assert variant == "raw_e" and config.seed == 4
    assert {k: getattr(config, k) for k in changed} == changed


def test_a_bad_value_names_the_declared_accepted_text():
    with pytest.raises(CaseError, match=r"epochs = 0 is not valid; expected an integer > 0\.$"):
        parse_case("epochs = 0", source="c.toml")


def test_the_generated_table_quotes_every_setting():
    tables = settings_table("top") + settings_table("model")
    for key, setting in SETTINGS.items():
        assert f"| `{key}` | {setting.type} |" in tables and setting.accepted in tables
