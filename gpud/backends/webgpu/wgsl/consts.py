"""Integer const expressions, evaluated with WGSL's typing (abstract, i32, u32) and overflow rules.

Literals (decimal or hex, suffix `i` or `u`), module-scope `const` names, parentheses, unary `-`, binary
`+ - * / %` with the usual precedence, and `i32(...)` / `u32(...)` conversions; anything else is
undetermined, and so is anything nested deeper than `_MAX_DEPTH`.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping, Sequence

from gpud.backends.webgpu.wgsl.lexer import is_ident, show, type_text
from gpud.backends.webgpu.wgsl.model import resolve_alias_text

_MAX_DEPTH = 32  # const-expression nesting (parentheses, unary operators, calls, references to other consts)
_MAX_LITERAL = 24  # characters of an integer literal (more cannot be in range)
_DEC_RE = re.compile(r"(0|[1-9][0-9]*)([iu]?)")
_HEX_RE = re.compile(r"0[xX]([0-9a-fA-F]+)([iu]?)")

_RANGES = {"abstract": (-(2**63), 2**63 - 1), "i32": (-(2**31), 2**31 - 1), "u32": (0, 2**32 - 1)}

_Int = tuple[int, str]  # (value, "abstract" | "i32" | "u32")


class Undetermined(Exception):
    """A value that is not determined exactly (message: why)."""


@dataclasses.dataclass
class Const:
    type_tokens: list[str] | None
    expr: list[str]


def _checked(value: int, kind: str) -> _Int:
    low, high = _RANGES[kind]
    if not low <= value <= high:
        raise Undetermined(f"{value} overflows {kind}")
    return value, kind


def _concretize(a: _Int, kind: str) -> _Int:
    """Convert an abstract integer to `kind` (WGSL's automatic conversion); concrete types must match."""
    if a[1] == kind:
        return a
    if a[1] != "abstract":
        raise Undetermined(f"{a[1]} used as {kind}")
    return _checked(a[0], kind)


def _binary(op: str, a: _Int, b: _Int) -> _Int:
    kind = a[1] if b[1] == "abstract" else b[1]
    x, _ = _concretize(a, kind)
    y, _ = _concretize(b, kind)
    if op == "+":
        return _checked(x + y, kind)
    if op == "-":
        return _checked(x - y, kind)
    if op == "*":
        return _checked(x * y, kind)
    if y == 0:
        raise Undetermined("division by zero")
    quotient = abs(x) // abs(y) * (1 if (x < 0) == (y < 0) else -1)  # truncating, as WGSL
    if op == "/":
        return _checked(quotient, kind)
    return _checked(x - y * quotient, kind)  # "%": the remainder takes the dividend's sign


class Evaluator:
    """Evaluates integer const expressions over the module's `const` declarations, memoising each const."""

    def __init__(self, consts: Mapping[str, Const | None], overrides: frozenset[str], aliases: Mapping[str, str]):
        self._consts = consts  # None: declared more than once
        self._overrides = overrides
        self._aliases = aliases
        self._memo: dict[str, _Int | str] = {}  # str: why the const is undetermined
        self._active: set[str] = set()

    def evaluate(self, tokens: Sequence[str], depth: int = 0) -> _Int:
        parser = _ExprParser(tokens, self)
        value = parser.additive(depth)
        if parser.pos != len(tokens):
            raise Undetermined(f"cannot evaluate {show(tokens[parser.pos])} in a const expression")
        return value

    def const(self, name: str, depth: int) -> _Int:
        known = self._memo.get(name)
        if isinstance(known, str):
            raise Undetermined(known)
        if known is not None:
            return known
        if name in self._overrides:
            raise Undetermined(f"{show(name)} is an override, not a const")
        if name not in self._consts:
            raise Undetermined(f"{show(name)} is not a module-scope const")
        decl = self._consts[name]
        if decl is None:
            raise Undetermined(f"{show(name)} is declared more than once")
        if name in self._active:
            raise Undetermined(f"const {show(name)} refers to itself")
        self._active.add(name)
        try:
            value = self.evaluate(decl.expr, depth + 1)
            if decl.type_tokens is not None:
                declared = resolve_alias_text(type_text(decl.type_tokens), self._aliases)
                if declared not in ("i32", "u32"):
                    raise Undetermined(f"const {show(name)} is not an integer")
                value = _concretize(value, declared)
        except Undetermined as exc:
            self._memo[name] = f"const {show(name)}: {exc}"
            raise Undetermined(f"const {show(name)}: {exc}") from None
        finally:
            self._active.discard(name)
        self._memo[name] = value
        return value


class _ExprParser:
    """Recursive descent over one expression's tokens; every nesting level counts towards `_MAX_DEPTH`."""

    def __init__(self, tokens: Sequence[str], evaluator: Evaluator) -> None:
        self.tokens = tokens
        self.pos = 0
        self.evaluator = evaluator

    def _peek(self) -> str:
        return self.tokens[self.pos] if self.pos < len(self.tokens) else ""

    def _expect(self, tok: str) -> None:
        if self._peek() != tok:
            raise Undetermined(f"expected {show(tok)} in a const expression")
        self.pos += 1

    def additive(self, depth: int) -> _Int:
        if depth > _MAX_DEPTH:
            raise Undetermined("const expression nested too deeply")
        value = self.multiplicative(depth)
        while self._peek() in ("+", "-"):
            op = self.tokens[self.pos]
            self.pos += 1
            value = _binary(op, value, self.multiplicative(depth))
        return value

    def multiplicative(self, depth: int) -> _Int:
        value = self.unary(depth)
        while self._peek() in ("*", "/", "%"):
            op = self.tokens[self.pos]
            self.pos += 1
            value = _binary(op, value, self.unary(depth))
        return value

    def unary(self, depth: int) -> _Int:
        if self._peek() == "-":
            self.pos += 1
            if depth + 1 > _MAX_DEPTH:
                raise Undetermined("const expression nested too deeply")
            if self._peek() == "-":
                raise Undetermined("'--' in a const expression")
            value, kind = self.unary(depth + 1)
            if kind == "u32":
                raise Undetermined("negation of a u32")
            return _checked(-value, kind)
        return self.primary(depth)

    def primary(self, depth: int) -> _Int:
        tok = self._peek()
        self.pos += 1
        if tok == "(":
            value = self.additive(depth + 1)
            self._expect(")")
            return value
        if tok[:1].isdigit() or tok[:1] == ".":
            return _literal(tok)
        if not is_ident(tok):
            raise Undetermined(f"cannot evaluate {show(tok)} in a const expression" if tok else "missing value")
        if self._peek() != "(":
            return self.evaluator.const(tok, depth)
        if tok not in ("i32", "u32"):
            raise Undetermined(f"cannot evaluate a call of {show(tok)} in a const expression")
        self.pos += 1
        if self._peek() == ")":
            self.pos += 1
            return 0, tok
        value = self.additive(depth + 1)
        if self._peek() == ",":
            self.pos += 1
        self._expect(")")
        if value[1] != "abstract" and value[1] != tok:
            # i32 <-> u32 reinterprets the bits; only a value that survives unchanged is accepted here
            return _checked(value[0], tok)
        return _concretize(value, tok)


def _literal(tok: str) -> _Int:
    if len(tok) > _MAX_LITERAL:
        raise Undetermined(f"literal {tok[:_MAX_LITERAL]}... is too long")
    m = _DEC_RE.fullmatch(tok)
    if m is not None:
        value = int(m.group(1))
    else:
        m = _HEX_RE.fullmatch(tok)
        if m is None:
            raise Undetermined(f"{show(tok)} is not an integer literal")
        value = int(m.group(1), 16)
    return _checked(value, {"": "abstract", "i": "i32", "u": "u32"}[m.group(2)])
