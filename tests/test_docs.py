"""The docs against the code, so that they fail together when they drift apart.

- docs/cases.md lists exactly the keys the case loader accepts, with the code's defaults.
- README.md stays a front door of at most 200 lines, holds both commands verbatim, its
  verdicts are those of reports/claims.md, and its claims (id, tested) those of the claims'
  table (``stability.claims.table.CLAIM_TABLE``).
- docs/architecture.md lists the public names, docs/reports.md the CSV columns.
- Every relative link (and its #anchor) in README.md and docs/*.md resolves.

docs/cases.md has one markdown table per scope, ``| key | type | default | accepted |``,
under the headings "Top-level keys", "`[model]` keys", "`[dataset]` keys" and one
"### `<data set>`" per data set. A default written as a backticked TOML value is compared
with the code; any other default ("every registered variant") is a computed one, checked
by name below.
"""

from __future__ import annotations

import re
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

import stability
from stability import list_variants
from stability.claims.table import CLAIM_TABLE
from stability.data import dataset_parameters, list_datasets
from stability.sweep.cases import _MODEL, _TABLES, _TOP_LEVEL, parse_case
from stability.sweep.settings import settings_table

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
CASES_DOC = ROOT / "docs" / "cases.md"
MARKDOWN = [README, *sorted((ROOT / "docs").glob("*.md"))]

MAIN_JOB = "pip install . && python -m stability claims --out reports/ --overwrite --workers 2"
TEST_COMMAND = 'pip install ".[test]" && python -m pytest'
README_MAX_LINES = 200

#: Keys whose default the code computes; the docs describe them in words.
COMPUTED_DEFAULTS = {"name", "variants"}
SCALARS = {"integer": int, "float": float, "string": str, "boolean": bool}


@dataclass(frozen=True)
class Row:
    key: str
    type: str
    default: str
    accepted: str

    @property
    def literal(self) -> str | None:
        """The default as TOML text, when the cell starts with one in backticks."""
        match = re.match(r"`([^`]+)`", self.default)
        return match.group(1) if match else None

    @property
    def value(self) -> Any:
        return tomllib.loads(f"v = {self.literal}")["v"]


def documented_keys() -> dict[str, dict[str, Row]]:
    """scope -> key -> row; scopes are "top", "model", "dataset" and "dataset:<name>"."""
    scopes: dict[str, dict[str, Row]] = {}
    section = scope = None
    for line in CASES_DOC.read_text(encoding="utf-8").splitlines():
        heading = re.match(r"(#{2,3}) (.+)", line)
        if heading:
            level, title = heading.groups()
            if level == "##":
                section = _section(title)
                scope = section
            else:
                name = re.fullmatch(r"`(\w+)`", title.strip())
                scope = f"dataset:{name.group(1)}" if section == "dataset" and name else None
            continue
        if scope is None or not line.startswith("| `"):
            continue
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        assert len(cells) == 4, f"docs/cases.md: not a key | type | default | accepted row: {line}"
        key, kind, default, accepted = cells
        row = Row(key.strip("`"), kind, default, accepted)
        assert row.key not in scopes.get(scope, {}), f"docs/cases.md: {row.key} twice in {scope}"
        scopes.setdefault(scope, {})[row.key] = row
    return scopes


def _section(title: str) -> str | None:
    if "Top-level" in title:
        return "top"
    if "[model]" in title:
        return "model"
    if "[dataset]" in title:
        return "dataset"
    return None


def matches(kind: str, value: Any) -> bool:
    """Whether ``value`` has the type the docs' type column names."""
    if kind.startswith("list of "):
        element = SCALARS[kind.removeprefix("list of ").rstrip("s")]
        return isinstance(value, (list, tuple)) and all(type(v) is element for v in value)
    return type(value) is SCALARS[kind]


def as_code(value: Any) -> Any:
    return tuple(value) if isinstance(value, list) else value


@pytest.fixture(scope="module")
def docs() -> dict[str, dict[str, Row]]:
    return documented_keys()


@pytest.fixture
def defaults(monkeypatch):
    """The case the loader builds from an empty file, without the tox dtype override."""
    monkeypatch.delenv("STABILITY_DTYPE", raising=False)
    return parse_case("", default_name="example")


# --- docs/cases.md against the loader ---------------------------------------------------


def test_top_level_keys_are_the_loaders(docs):
    assert set(docs["top"]) == {*_TOP_LEVEL, *_TABLES}


def test_model_keys_are_the_loaders(docs):
    assert set(docs["model"]) == set(_MODEL)


def test_every_data_set_is_documented_with_its_parameters(docs):
    assert set(docs["dataset"]) == {"name"}
    documented = {scope.split(":", 1)[1] for scope in docs if scope.startswith("dataset:")}
    # The built-in data sets: a zoo bug's module or a plugin another test in this process
    # loaded registers its own, documented with it (docs/zoo.md), not in docs/cases.md.
    from stability.data import registry

    def builtin(name):
        module = registry._datasets.get(name).__module__
        return module.startswith("stability.") and not module.startswith("stability.zoo.bugs")

    assert documented == {name for name in list_datasets() if builtin(name)}
    for name in documented:
        assert set(docs[f"dataset:{name}"]) == set(dataset_parameters(name)), name


def test_top_level_and_model_defaults_are_the_loaders(docs, defaults):
    for scope in ("top", "model"):
        for key, row in docs[scope].items():
            if row.type == "table":
                continue
            code = getattr(defaults, key)
            assert matches(row.type, code), f"{key}: the code's default {code!r} is no {row.type}"
            if key in COMPUTED_DEFAULTS:
                assert row.literal is None, f"{key}: its default is computed, not {row.literal}"
                continue
            assert row.literal is not None, f"{key}: no default in backticks in docs/cases.md"
            assert as_code(row.value) == code, f"{key}: docs say {row.value!r}, code {code!r}"
            assert matches(row.type, row.value), f"{key}: {row.value!r} is no {row.type}"


def test_computed_defaults(docs, defaults):
    computed = {key for key, row in docs["top"].items() if row.literal is None}
    assert computed == {*COMPUTED_DEFAULTS, *_TABLES}
    assert defaults.name == "example"
    assert defaults.variants == tuple(v.name for v in list_variants())


def test_dataset_defaults_are_the_builders(docs, defaults):
    assert docs["dataset"]["name"].value == defaults.dataset
    for scope, rows in docs.items():
        if not scope.startswith("dataset:"):
            continue
        code = dataset_parameters(scope.split(":", 1)[1])
        for key, row in rows.items():
            assert row.literal is not None, f"{scope}.{key}: no default in backticks"
            assert row.value == code[key], (
                f"{scope}.{key}: docs say {row.value!r}, code {code[key]!r}"
            )
            assert type(row.value) is type(code[key]), f"{scope}.{key}: {row.value!r}"
            assert matches(row.type, code[key]), f"{scope}.{key}: {code[key]!r} is no {row.type}"


def test_accepted_values_quote_the_loader(docs):
    for scope, table in (("top", _TOP_LEVEL), ("model", _MODEL)):
        for key, (_, accepted) in table.items():
            assert accepted in docs[scope][key].accepted, (
                f"{key}: docs/cases.md should say {accepted!r}, says {docs[scope][key].accepted!r}"
            )


@pytest.mark.parametrize("scope", ["top", "model"])
def test_the_settings_tables_are_generated_from_the_declarations(scope, monkeypatch):
    """docs/cases.md holds the tables ``stability.sweep.settings`` renders, byte for byte
    (regenerate them with ``settings_table``)."""
    monkeypatch.delenv("STABILITY_DTYPE", raising=False)  # the default, not tox's override
    table = settings_table(scope)
    assert table in CASES_DOC.read_text(encoding="utf-8"), (
        f"docs/cases.md: the {scope} table differs from settings_table({scope!r}):\n{table}"
    )


def test_the_remedy_table_is_generated_from_the_registry():
    """docs/doctor.md holds, between its markers, the table the registry of remedies
    renders, byte for byte (regenerate it with ``stability.doctor.report.with_remedy_table``)."""
    from stability.doctor.report import remedy_table, with_remedy_table

    doc = (ROOT / "docs" / "doctor.md").read_text(encoding="utf-8")
    assert with_remedy_table(doc) == doc, (
        f"docs/doctor.md: the remedy table differs from remedy_table():\n{remedy_table()}"
    )


def test_documented_defaults_load(docs):
    """Each default, written into a case file as the docs show it, passes the loader."""
    for scope, rows in docs.items():
        for key, row in rows.items():
            if row.literal is None:
                continue
            if scope == "top":
                text = f"{key} = {row.literal}"
            elif scope == "model":
                text = f"[model]\n{key} = {row.literal}"
            elif scope == "dataset":
                text = f"[dataset]\n{key} = {row.literal}"
            else:
                name = scope.split(":", 1)[1]
                text = f'[dataset]\nname = "{name}"\n{key} = {row.literal}'
            parse_case(text, source=f"docs/cases.md {scope}.{key}")


# --- README.md ----------------------------------------------------------------------------


def test_readme_is_a_short_front_door():
    lines = README.read_text(encoding="utf-8").splitlines()
    assert len(lines) <= README_MAX_LINES, f"README.md has {len(lines)} lines"


def test_readme_holds_both_commands_verbatim():
    lines = README.read_text(encoding="utf-8").splitlines()
    assert MAIN_JOB in lines
    assert TEST_COMMAND in lines
    assert TEST_COMMAND in (ROOT / ".ci" / "run").read_text(encoding="utf-8").splitlines()


def verdicts(path: Path, name: str = "verdict") -> dict[str, str]:
    """claim id -> verdict (or the column ``name``), from a markdown table with an ``id`` and
    a ``verdict`` column (other tables with an ``id`` column, such as claims.md's float64
    one, are skipped)."""
    found, column = {}, None
    for line in path.read_text(encoding="utf-8").splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if line.startswith("|") and cells[0] == "id":
            column = cells.index(name) if "verdict" in cells else None
        elif line.startswith("|") and column is not None and re.fullmatch(r"C\d+[ab]?", cells[0]):
            found[cells[0]] = cells[column]
    return found


def test_readme_verdicts_are_those_of_the_claims_report():
    assert verdicts(README) == verdicts(ROOT / "reports" / "claims.md")


def test_readme_lists_the_claims_of_the_table():
    """README's table has one row per claim of ``CLAIM_TABLE``, in its order and with its
    *tested* words."""
    tested = verdicts(README, "tested")
    assert list(tested.items()) == [(c.id, c.tested) for c in CLAIM_TABLE]


# --- links ----------------------------------------------------------------------------------

LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")
FENCE = re.compile(r"^```.*?^```", re.MULTILINE | re.DOTALL)


def anchors(path: Path) -> set[str]:
    """GitHub's anchors for the headings of a markdown file."""
    text = FENCE.sub("", path.read_text(encoding="utf-8"))
    titles = re.findall(r"^#{1,6} (.+)$", text, re.MULTILINE)
    return {re.sub(r"[^\w\- ]", "", title.strip().lower()).replace(" ", "-") for title in titles}


def relative_links(path: Path) -> list[str]:
    text = FENCE.sub("", path.read_text(encoding="utf-8"))
    return [t for t in LINK.findall(text) if not re.match(r"[a-z]+:", t)]


@pytest.mark.parametrize("path", MARKDOWN, ids=[p.relative_to(ROOT).as_posix() for p in MARKDOWN])
def test_relative_links_resolve(path):
    for target in relative_links(path):
        file, _, anchor = target.partition("#")
        resolved = (path.parent / file).resolve() if file else path
        assert resolved.exists(), f"{path.name}: link {target!r} points at nothing"
        if anchor and resolved.suffix == ".md":
            assert anchor in anchors(resolved), f"{path.name}: no heading for {target!r}"


def test_architecture_lists_the_public_names():
    text = (ROOT / "docs" / "architecture.md").read_text(encoding="utf-8")
    section = text.split("## Public names", 1)[1].split("They load lazily", 1)[0]
    assert set(re.findall(r"`(\w+)`", section)) == set(stability.__all__)


def test_reports_page_lists_the_csv_columns():
    text = (ROOT / "docs" / "reports.md").read_text(encoding="utf-8")
    columns = re.search(r"`(case, variant[^`]*)`", text).group(1)
    assert tuple(c.strip() for c in columns.split(",")) == stability.RESULT_FIELDS
