"""A claim's id is written once, in its row of ``CLAIM_TABLE``: everything else finds a
claim by its role (``by_role``) or reads the table, so renumbering the table cannot leave
a stale id behind."""

import ast
import re
from pathlib import Path

import pytest

import stability
from stability.claims.table import CLAIM_TABLE, ROLES, by_role, family

PACKAGE = Path(stability.__file__).parent
TABLE = PACKAGE / "claims" / "table.py"
#: A claim id as the table spells it: C1a, C2b, C3, C11a.
CLAIM_ID = re.compile(r"\bC\d+[a-z]?\b")


def _docstrings(tree: ast.AST) -> set[int]:
    """The ids of the nodes that are docstrings (text for readers, not output)."""
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
                found.add(id(body[0].value))
    return found


def claim_ids_written(path: Path) -> list[str]:
    """``line: text`` of each string literal of ``path`` (docstrings aside) naming a claim id."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    skip = _docstrings(tree)
    return [
        f"{node.lineno}: {node.value!r}"
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant)
        and isinstance(node.value, str)
        and id(node) not in skip
        and CLAIM_ID.search(node.value)
    ]


@pytest.mark.parametrize(
    "path",
    [p for p in sorted(PACKAGE.rglob("*.py")) if p != TABLE],
    ids=lambda p: str(p.relative_to(PACKAGE)),
)
def test_no_claim_id_is_written_outside_the_table(path):
    found = claim_ids_written(path)
    assert not found, f"claim ids written by hand (read them from CLAIM_TABLE): {found}"


def test_the_check_sees_an_id_in_an_f_string(tmp_path):
    source = tmp_path / "m.py"
    source.write_text('"""C11 in a docstring is prose."""\nx = f"({1}) C11a {2}"\n')
    assert claim_ids_written(source) == ["2: ') C11a '"]


def test_every_role_has_one_claim():
    assert len({by_role(role).id for role in ROLES}) == len(ROLES)
    assert all(family(c) in c.id for c in CLAIM_TABLE)
