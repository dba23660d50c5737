"""Bug injection: small AST-located edits of Python source (for the SWE task maker).

Each operator finds sites with `ast` and rewrites only the bytes of that site, so the
mutated file differs from the original in one place and the gold patch (the reversal)
is a one-hunk diff, like a real bug fix. `ast.unparse` is never used: it would
reformat the whole file. Sites are enumerated in source order and shuffled with a
seeded `random.Random`, so the same source and seed give the same mutations.

The `description` of a mutation is for the maker's logs and tests only; it must never
reach an agent (the problem statement is written from test output alone).
"""
from __future__ import annotations

import ast
import dataclasses
import random
import re
from typing import Callable, Iterator

# op class -> (source text of the op, source text of its replacement)
_COMPARE_SWAP = {ast.Lt: ("<", "<="), ast.LtE: ("<=", "<"), ast.Gt: (">", ">="), ast.GtE: (">=", ">"),
                 ast.Eq: ("==", "!="), ast.NotEq: ("!=", "=="), ast.Is: ("is", "is not"),
                 ast.IsNot: ("is not", "is"), ast.In: ("in", "not in"), ast.NotIn: ("not in", "in")}
_BINOP_SWAP = {ast.Add: ("+", "-"), ast.Sub: ("-", "+"), ast.Mult: ("*", "//"), ast.FloorDiv: ("//", "*"),
               ast.Mod: ("%", "//")}
_BOOL_SWAP = {ast.And: ("and", "or"), ast.Or: ("or", "and")}


@dataclasses.dataclass(frozen=True)
class Mutation:
    """One injected bug in one file: `source` -> `mutated`."""

    path: str  # file path as given (relative to the project root in the maker)
    operator: str  # e.g. "compare_flip"
    lineno: int  # 1-based line of the site in the original source
    description: str  # human note; maker-internal, never shown to agents
    source: str
    mutated: str


@dataclasses.dataclass(frozen=True)
class _Edit:
    start: int  # byte offsets into the UTF-8 source
    end: int
    text: str
    lineno: int
    operator: str
    description: str


class _Source:
    """Byte offsets from ast positions (col_offset counts UTF-8 bytes, not characters)."""

    def __init__(self, text: str):
        self.data = text.encode("utf-8")
        self.line_starts = [0]
        for m in re.finditer(rb"\n", self.data):
            self.line_starts.append(m.end())

    def offset(self, lineno: int, col: int) -> int:
        return self.line_starts[lineno - 1] + col

    def span(self, node: ast.AST) -> tuple[int, int]:
        return self.offset(node.lineno, node.col_offset), self.offset(node.end_lineno, node.end_col_offset)

    def text(self, start: int, end: int) -> str:
        return self.data[start:end].decode("utf-8")


def _gap_edit(src: _Source, left: ast.AST, right: ast.AST, old: str, new: str, node: ast.AST,
              operator: str) -> _Edit | None:
    """Replace the operator token `old` that sits between two operands (parentheses allowed)."""
    start, end = src.span(left)[1], src.span(right)[0]
    gap = src.text(start, end)
    if "#" in gap or "\\" in gap:  # a comment or continuation between operands: leave it alone
        return None
    pattern = r"\bnot\s+in\b" if old == "not in" else r"\bis\s+not\b" if old == "is not" else re.escape(old)
    if old.isalpha():
        pattern = rf"\b{pattern}\b"
    found = list(re.finditer(pattern, gap))
    if len(found) != 1:
        return None
    m = found[0]
    lo, hi = start + len(gap[:m.start()].encode()), start + len(gap[:m.end()].encode())
    return _Edit(lo, hi, new, node.lineno, operator, f"line {node.lineno}: `{old}` -> `{new}`")


def _compare_flip(src: _Source, node: ast.AST) -> Iterator[_Edit]:
    if isinstance(node, ast.Compare):
        operands = [node.left, *node.comparators]
        for i, op in enumerate(node.ops):
            old, new = _COMPARE_SWAP[type(op)]
            edit = _gap_edit(src, operands[i], operands[i + 1], old, new, node, "compare_flip")
            if edit:
                yield edit


def _binop_swap(src: _Source, node: ast.AST) -> Iterator[_Edit]:
    if isinstance(node, ast.BinOp) and type(node.op) in _BINOP_SWAP:
        if isinstance(node.left, ast.Constant) and isinstance(node.left.value, str):
            return  # "..." % args is formatting, not arithmetic
        old, new = _BINOP_SWAP[type(node.op)]
        edit = _gap_edit(src, node.left, node.right, old, new, node, "arith_swap")
        if edit:
            yield edit


def _bool_swap(src: _Source, node: ast.AST) -> Iterator[_Edit]:
    if isinstance(node, ast.BoolOp) and len(node.values) == 2:
        old, new = _BOOL_SWAP[type(node.op)]
        edit = _gap_edit(src, node.values[0], node.values[1], old, new, node, "bool_swap")
        if edit:
            yield edit


def _constant(src: _Source, node: ast.AST) -> Iterator[_Edit]:
    """Off-by-one on integer literals (also indices and slice bounds); True <-> False."""
    if not isinstance(node, ast.Constant):
        return
    start, end = src.span(node)
    old = src.text(start, end)
    if isinstance(node.value, bool):
        new = "False" if node.value else "True"
        yield _Edit(start, end, new, node.lineno, "constant", f"line {node.lineno}: {old} -> {new}")
    elif isinstance(node.value, int) and re.fullmatch(r"\d+", old):
        for new_value in (node.value + 1, node.value - 1):
            if new_value >= 0:
                yield _Edit(start, end, str(new_value), node.lineno, "constant",
                            f"line {node.lineno}: {old} -> {new_value}")


def _negate_condition(src: _Source, node: ast.AST) -> Iterator[_Edit]:
    if isinstance(node, (ast.If, ast.While, ast.IfExp)):
        start, end = src.span(node.test)
        if isinstance(node.test, ast.UnaryOp) and isinstance(node.test.op, ast.Not):
            inner = src.span(node.test.operand)
            new = src.text(*inner)
            if isinstance(node.test.operand, (ast.BoolOp, ast.Compare, ast.NamedExpr)):
                new = f"({new})"
        else:
            text = src.text(start, end)
            simple = isinstance(node.test, (ast.Name, ast.Call, ast.Attribute, ast.Subscript))
            new = f"not {text}" if simple else f"not ({text})"
        yield _Edit(start, end, new, node.lineno, "negate_condition",
                    f"line {node.lineno}: condition negated")


def _drop_statement(src: _Source, node: ast.AST) -> Iterator[_Edit]:
    """Replace one simple statement of a multi-statement body by `pass` (a missing step)."""
    for field in ("body", "orelse", "finalbody"):
        body = getattr(node, field, None)
        if not isinstance(body, list) or len(body) < 2:
            continue
        for stmt in body:
            if not isinstance(stmt, (ast.Expr, ast.Assign, ast.AugAssign, ast.AnnAssign, ast.Return,
                                     ast.Raise, ast.Break, ast.Continue)):
                continue
            if isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Constant):
                continue  # docstrings and bare literals do nothing
            start, end = src.span(stmt)
            yield _Edit(start, end, "pass", stmt.lineno, "drop_statement", f"line {stmt.lineno}: statement removed")


def _swap_arguments(src: _Source, node: ast.AST) -> Iterator[_Edit]:
    if not isinstance(node, ast.Call) or len(node.args) < 2:
        return
    a, b = node.args[0], node.args[1]
    if any(isinstance(x, ast.Starred) for x in (a, b)) or ast.dump(a) == ast.dump(b):
        return
    (a0, a1), (b0, b1) = src.span(a), src.span(b)
    between = src.text(a1, b0)
    if "#" in between or "\n" in between:
        return
    new = src.text(b0, b1) + between + src.text(a0, a1)
    yield _Edit(a0, b1, new, node.lineno, "swap_arguments", f"line {node.lineno}: first two arguments swapped")


OPERATORS: dict[str, Callable[[_Source, ast.AST], Iterator[_Edit]]] = {
    "compare_flip": _compare_flip, "arith_swap": _binop_swap, "bool_swap": _bool_swap,
    "constant": _constant, "negate_condition": _negate_condition, "drop_statement": _drop_statement,
    "swap_arguments": _swap_arguments,
}


def _skipped_lines(tree: ast.Module) -> set[int]:
    """Lines not worth mutating: docstrings, `__all__`/`__version__`, `if __name__ == ...` blocks."""
    skip: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id.startswith("__")
                                                for t in node.targets):
            skip.update(range(node.lineno, node.end_lineno + 1))
        if isinstance(node, ast.If) and "__name__" in ast.dump(node.test):
            skip.update(range(node.lineno, node.end_lineno + 1))
    return skip


def _edits(source: str) -> list[_Edit]:
    tree = ast.parse(source)
    src = _Source(source)
    skip = _skipped_lines(tree)
    found = []
    for node in ast.walk(tree):
        for op in OPERATORS.values():
            found.extend(e for e in op(src, node) if e.lineno not in skip)
    return sorted(set(found), key=lambda e: (e.start, e.end, e.text))


def _apply(source: str, edit: _Edit) -> str:
    data = source.encode("utf-8")
    return (data[:edit.start] + edit.text.encode() + data[edit.end:]).decode("utf-8")


def mutations(source: str, path: str = "<string>", seed: int = 0,
              operators: tuple[str, ...] | None = None) -> list[Mutation]:
    """Every valid mutation of `source`, in a seeded order.

    A mutation is kept only if the result still parses and its AST differs from the
    original's (e.g. swapping two equal-looking arguments changes nothing).
    """
    unknown = set(operators or ()) - set(OPERATORS)
    if unknown:
        raise ValueError(f"unknown mutation operators {sorted(unknown)}; valid: {sorted(OPERATORS)}")
    original = ast.dump(ast.parse(source))
    result = []
    for edit in _edits(source):
        if operators and edit.operator not in operators:
            continue
        mutated = _apply(source, edit)
        try:
            if ast.dump(ast.parse(mutated)) == original:
                continue
        except SyntaxError:
            continue
        result.append(Mutation(path, edit.operator, edit.lineno, f"{path}:{edit.description}", source, mutated))
    random.Random(f"{seed}:{path}").shuffle(result)
    return result
