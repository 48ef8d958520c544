"""The fix as code: the line of the user's code an op guard rewrote, before and after.

An op guard (``stability.model.op_guard``) records the file and line that built each op it
rewrote (``Site``). Here that line is read back and the call that built the op rewritten as
the guard computes it: ``tf.sqrt(d2)`` becomes ``tf.sqrt(tf.maximum(d2, EPS))`` with ``EPS``
the dtype's machine epsilon written out. The line is parsed with ``ast``, so the rewrite
finds the op however the user spelt it (``tf.math.sqrt``, ``keras.ops.sqrt``, ``K.sqrt``,
``x / y``, ``x ** -0.5``); an op built inside another call (``tf.norm``'s ``Sqrt``) is
shown at that call, with the guard's expression to put in its place.
"""

from __future__ import annotations

import ast
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from stability.model.op_guard import OpGuard, Site, exp_cap, guard_named, joined_source
from stability.model.remedy import Remedy

#: The binary operators that build an op type, for a guard's op types.
_OPERATORS = {
    "RealDiv": ast.Div,
    "Div": ast.Div,
    "Pow": ast.Pow,
    "Mul": ast.Mult,
    "Sub": ast.Sub,
}


@dataclass(frozen=True)
class CodeFix:
    """One rewritten line: where it is, and the line before and after (an expression over
    several lines, ``line`` to ``end_line``, joined into one)."""

    file: str
    line: int
    before: str
    after: str
    end_line: int | None = None

    @property
    def where(self) -> str:
        lines = f"{self.line}-{self.end_line}" if self.end_line else str(self.line)
        return f"{_short(self.file)}:{lines}"


def _short(file: str) -> str:
    """A path relative to the working folder where it is inside it."""
    try:
        return str(Path(file).resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return file


def fixes_text(fixes: Sequence[CodeFix]) -> str:
    """``file:line: before => after`` for each fix, `` | ``-joined (a CSV cell's form)."""
    return " | ".join(f"{f.where}: {f.before} => {f.after}" for f in fixes)


def bounds(dtype: str) -> dict[str, str]:
    """The constants a guard's code names, written out for ``dtype`` (a policy's compute
    dtype for ``mixed_float16``)."""
    info = np.finfo(np.dtype(dtype.removeprefix("mixed_")))
    import tensorflow as tf

    cap = exp_cap(tf.as_dtype(info.dtype))
    return {
        "EPS": f"{float(info.eps):.3g}",
        "TINY": f"{float(info.tiny):.3g}",
        "CAP": f"{cap:.4g}",
        # Every digit the dtype has: the guard compares with the lowest number exactly.
        "LOWEST": f"{float(info.min):.9g}",
    }


def remedy_fixes(remedy: Remedy | None, sites: Sequence[Site], dtype: str) -> list[CodeFix]:
    """The lines of the user's code an op guard's remedy rewrote at ``sites`` (both
    doctors' trials and repairs record them), before and after, with ``dtype``'s bounds
    written out; none for no remedy, or one that is not an op guard."""
    if remedy is None or not remedy.is_op_guard or not sites:
        return []
    return code_fixes(sites, dtype)


def code_fixes(sites: Sequence[Site], dtype: str) -> list[CodeFix]:
    """The rewritten line for each distinct line of ``sites`` (in order), by the guards
    that rewrote its ops; a site whose line cannot be read is left out. Where a guard
    changed a value at some of its sites (``Site.changed``, seen on the doctor's eager
    batch), only those are its fix: the others (``d / cutoff`` with a constant cutoff)
    compute what they did. A guard that changed nothing there (its failure comes after some
    training) keeps all its sites. Two guards of one line (a chain: the division and the
    log of a loss) both rewrite it."""
    by_line: dict[tuple[str, int, int | None], dict[tuple, Site]] = {}
    for site in _kept(sites):
        if site.file is not None and site.line is not None:
            group = by_line.setdefault((site.file, site.line, site.end_line), {})
            group.setdefault((site.guard, site.col, site.end_col), site)
    fixes = []
    for (file, line, end_line), group in by_line.items():
        # An expression over several lines is read as one: its end column moves by shift.
        raw, shift = joined_source(file, line, end_line)
        before = raw.strip()
        if not before:
            continue
        indent = len(raw) - len(raw.lstrip())
        after = before
        # The rightmost op first: the columns of the ops left of it stay the line's own.
        for site in sorted(group.values(), key=lambda s: -1 if s.col is None else -s.col):
            span = None
            if site.col is not None and site.end_col is not None:
                span = (site.col - indent, site.end_col + shift - indent)
            after = rewrite_line(after, guard_named(site.guard), dtype, span, site.segments)
        fixes.append(CodeFix(file, line, before, after, end_line))
    return fixes


def _kept(sites: Sequence[Site]) -> list[Site]:
    """Each guard's sites where it changed a value, or all of them where it changed none."""
    kept = []
    for guard in dict.fromkeys(site.guard for site in sites):
        own = [site for site in sites if site.guard == guard]
        kept += [site for site in own if site.changed] or own
    return kept


def rewrite_line(
    line: str,
    guard: OpGuard,
    dtype: str,
    span: tuple[int, int] | None = None,
    segments: str | None = None,
) -> str:
    """``line`` with the call (or operator) that builds ``guard``'s op rewritten as the
    guard computes it: the one at the columns ``span`` (where the op was built) when that
    is such a call, else the innermost; the guard's expression alone, as a comment, where
    the line holds no such call. A segmented guard's ids are ``segments`` (the user's text
    of them), or ``SEGMENT_IDS`` where the doctor could not read them."""
    constants = {**bounds(dtype), "IDS": segments or "SEGMENT_IDS"}
    tree, shift, text = _parse(line)
    if span is not None:
        span = (span[0] + shift, span[1] + shift)
    target = _target(tree, guard, span) if tree is not None else None
    if target is None:
        return f"{line}  # guard its {'/'.join(guard.op_types)}: {_label(guard, constants)}"
    call, args = _call_parts(target, text)
    new = _fill(guard.code(call, args), constants)
    start, end = target.col_offset - shift, target.end_col_offset - shift
    return line[:start] + new + line[end:]


def _label(guard: OpGuard, constants: dict[str, str]) -> str:
    text = guard.label.replace("eps", constants["EPS"]).replace("tiny", constants["TINY"])
    return text.replace("log(max) / 2", constants["CAP"])


def _fill(code: str, constants: dict[str, str]) -> str:
    for name, value in constants.items():
        code = code.replace(name, value)
    return code


def _parse(line: str) -> tuple[ast.AST | None, int, str]:
    """The line as an expression or statement, how far its columns moved, and the text
    parsed; a line that opens a block (``if x:``, ``return f(``) is parsed as far as it is
    whole."""
    bare = line.removeprefix("return ")
    tries = (
        (line, 0),
        (line.rstrip(":") + ": pass", 0),
        (bare.rstrip("(,"), len(bare) - len(line)),
    )
    for text, shift in tries:
        try:
            return ast.parse(text), shift, text
        except SyntaxError:
            continue
    return None, 0, line


def _target(tree: ast.AST, guard: OpGuard, span: tuple[int, int] | None) -> ast.AST | None:
    """The call of one of the guard's names, or operator of its op, in ``tree``: the one at
    ``span`` where there is one, else the innermost call, else the first operator."""
    operators = {_OPERATORS[t] for t in guard.op_types if t in _OPERATORS}
    calls, binops = [], []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and _name(node.func) in guard.calls:
            calls.append(node)
        elif isinstance(node, ast.BinOp) and type(node.op) in operators:
            binops.append(node)
    for node in [*calls, *binops]:
        if span is not None and (node.col_offset, node.end_col_offset) == span:
            return node
    if calls:
        return calls[-1]
    return binops[0] if binops else None


def _name(func: ast.AST) -> str:
    if isinstance(func, ast.Attribute):
        return func.attr
    return func.id if isinstance(func, ast.Name) else ""


def _call_parts(node: ast.AST, text: str) -> tuple[str, list[str]]:
    """The called function's text and the arguments', as the user wrote them in ``text``
    (an operator as ``tf.pow(a, b)``, ``tf.divide(a, b)`` or ``tf.multiply(a, b)``)."""

    def source(part: ast.AST) -> str:
        return ast.get_source_segment(text, part) or ast.unparse(part)

    if isinstance(node, ast.BinOp):
        names = {ast.Pow: "tf.pow", ast.Mult: "tf.multiply", ast.Sub: "tf.subtract"}
        name = names.get(type(node.op), "tf.divide")
        return name, [source(node.left), source(node.right)]
    assert isinstance(node, ast.Call)
    return source(node.func), [source(a) for a in [*node.args, *node.keywords]]
