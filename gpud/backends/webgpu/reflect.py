"""Reflection of a WGSL module's resource bindings, in pure Python, without compiling the module.

The daemon needs two facts about a kernel before it runs it: which tensor arguments it may *write*
(so that shared read-only tensors cannot be overwritten) and what its interface looks like (to check
a dispatch's arguments). `reflect(source)` tokenises the module, parses its module-scope declarations
and returns every resource variable (`@group(g) @binding(b) var ...`) with its address space and
access mode, plus every struct.

Fail safe: the reflection never claims that a binding is read-only unless it is sure. Anything about a
resource variable that it cannot determine exactly (an `override`, a const expression it does not
evaluate, a declaration it does not parse, a character that is not WGSL) makes the result inexact
(`Reflection.exact` is False, `Reflection.problems` says why), and `Reflection.written()` then returns
None, meaning "every binding may be written". `reflect` never raises on bad input and runs in linear
time: there is no recursion except in const-expression evaluation, whose depth is capped.

What is parsed:
- tokens as WGSL (and naga) define them: blankspace, line comments ending at any WGSL line break,
  nested block comments, identifiers, numbers, one-character punctuation;
- directives `enable`, `requires`, `diagnostic` (skipped), and module-scope `struct`, `alias`, `const`,
  `override`, `var`, `fn` (body skipped by brace matching), `const_assert` (skipped) and `;`;
- attributes `@name` or `@name(...)` anywhere before a declaration or a struct member; only `@group`
  and `@binding` on a `var` are interpreted;
- integer const expressions: integer literals (decimal or hex, suffix `i` or `u`), module-scope `const`
  names, parentheses, unary `-`, binary `+ - * / %` with the usual precedence, and `i32(...)` / `u32(...)`
  conversions of integers, with WGSL's typing (abstract, i32, u32) and overflow rules.

Anything else in a group or binding value, or in a const it refers to, is undetermined.

Limits, all on the safe side:
- the reflection is of the whole module, not of one entry point: `written()` includes bindings that only other
  entry points use, and variables sharing a binding index all count (`group()` returns the first declared);
- a resource variable whose group or binding is undetermined is left out of `bindings`; one whose access is
  undetermined is listed as "read_write"; either makes the reflection inexact;
- a const's initialiser is parsed only when a group or binding value refers to it, so an unused const that
  cannot be evaluated does not make the reflection inexact;
- deeper than 32 levels (parentheses, calls, chains of consts referring to consts), a value is undetermined;
- a module that declares a name the reflection reads by spelling (`storage`, `read_write`, `u32`, `sampler`,
  `texture_*`...), an unterminated block comment (which naga accepts, ignoring the rest), a character that is
  not WGSL anywhere (function bodies included), or any declaration that does not parse makes it inexact.
"""

from __future__ import annotations

import bisect
import dataclasses
import itertools
import re
import types
from collections.abc import Iterable, Mapping, Sequence

__all__ = ["Binding", "Member", "Reflection", "reflect"]


@dataclasses.dataclass(frozen=True)
class Binding:
    """One resource variable of the module."""

    group: int
    binding: int
    name: str
    space: str  # "storage" | "uniform" | "handle" (textures, samplers and other non-buffer types)
    access: str  # "read" | "read_write" | "write" (storage textures); uniform -> "read"
    type: str  # the declared type, whitespace-normalised, e.g. "array<f32>" or "Params"


@dataclasses.dataclass(frozen=True)
class Member:
    """One member of a struct."""

    name: str
    type: str  # whitespace-normalised type text, e.g. "f32", "u32", "vec3<f32>"


_WRITABLE_ACCESS = frozenset({"read_write", "write"})
_SCALARS = frozenset({"f32", "f16", "i32", "u32"})


@dataclasses.dataclass(frozen=True)
class Reflection:
    """What `reflect` found in a module."""

    bindings: tuple[Binding, ...]  # every resource variable found, in source order
    structs: Mapping[str, tuple[Member, ...]] = dataclasses.field(hash=False)  # every struct of the module
    exact: bool  # False if anything about a resource variable was undetermined
    problems: tuple[str, ...]  # human-readable reasons it is inexact (empty when exact)
    # alias name -> aliased type text, used to resolve the type of a uniform
    _aliases: Mapping[str, str] = dataclasses.field(
        default_factory=lambda: types.MappingProxyType({}), repr=False, compare=False, hash=False
    )

    def group(self, group: int) -> dict[int, Binding]:
        """Binding index -> Binding for one group. Where several variables share a binding index (legal when
        different entry points use them), the first declared is returned."""
        out: dict[int, Binding] = {}
        for b in self.bindings:
            if b.group == group:
                out.setdefault(b.binding, b)
        return out

    def written(self, group: int = 0) -> frozenset[int] | None:
        """The binding indices of `group` that may be written (storage buffers with read_write access,
        storage textures with write or read_write access), or None when the reflection is not exact:
        then every binding may be written."""
        if not self.exact:
            return None
        return frozenset(b.binding for b in self.bindings if b.group == group and b.access in _WRITABLE_ACCESS)

    def uniform_members(self, group: int, binding: int) -> tuple[Member, ...] | None:
        """The members of the struct type of the uniform at (group, binding). A uniform of a scalar type
        (f32, f16, i32, u32) gives one Member named after the variable. None if there is no uniform there,
        or its type is neither a scalar nor a struct declared in the module."""
        b = self.group(group).get(binding)
        if b is None or b.space != "uniform":
            return None
        resolved = _resolve_alias_text(b.type, self._aliases)
        if resolved is None:
            return None
        members = self.structs.get(resolved)
        if members is not None:
            return members
        if resolved in _SCALARS:
            return (Member(b.name, resolved),)
        return None


# ---------------------------------------------------------------------------------------------------------------
# Tokens

_MAX_DEPTH = 32  # const-expression nesting (parentheses, unary operators, calls, references to other consts)
_MAX_ALIASES = 64  # length of an alias chain
_MAX_PROBLEMS = 20
_MAX_LITERAL = 24  # characters of an integer literal (more cannot be in range)

_PUNCT = "-&|@/![]{}:,=<>%.+()*;~^"
_NOT_IDENT_START = frozenset(_PUNCT + "0123456789")

# WGSL's blankspace and line breaks (Unicode Pattern_White_Space), and its one-character punctuation
_BLANKS = "\t\n\x0b\x0c\r \x85\u200e\u200f\u2028\u2029"
_LINE_BREAKS = "\n\x0b\x0c\r\x85\u2028\u2029"
_PUNCT_CLASS = re.escape(_PUNCT)
_TOKEN = (
    rf"[{re.escape(_PUNCT.replace('.', ''))}]"  # punctuation, except "." which may start a number
    r"|[^\W\d]\w*"  # identifiers (checked against XID where the source is not ASCII)
    r"|0[xX][0-9a-fA-F]*(?:\.[0-9a-fA-F]*)?(?:[pP][+-]?[0-9]+)?[fhiu]?"  # numbers, valid or not
    r"|[0-9]+(?:\.[0-9]*)?(?:[eE][+-]?[0-9]+)?[fhiu]?"
    r"|\.[0-9]+(?:[eE][+-]?[0-9]+)?[fh]?"
    r"|\."
    rf"|[^{_BLANKS}\w{_PUNCT_CLASS}]+"  # runs of characters that are not WGSL
    r"|."
)
# A match starts at every position of a comment-free stretch of source (the last alternatives take any character, and
# \Z the trailing blankspace), so `findall` never rescans: it runs in linear time.
_TOKEN_RE = re.compile(rf"[{_BLANKS}]*({_TOKEN}|\Z)", re.DOTALL)
_RAW_TOKEN_RE = re.compile(rf"[{_BLANKS}]*(?:{_TOKEN}|\Z)", re.DOTALL)  # the same, blankspace included
_COMMENT_RE = re.compile(rf"//[^{_LINE_BREAKS}]*|/\*")
_BLOCK_RE = re.compile(r"/\*|\*/")
_NOT_WGSL_RE = re.compile(rf"[^{_BLANKS}\w{_PUNCT_CLASS}]")
_NON_ASCII_RE = re.compile(r"[^\x00-\x7f]")
_IDENT_START_RE = re.compile(r"[^\W\d]")
_DEC_RE = re.compile(r"(0|[1-9][0-9]*)([iu]?)")
_HEX_RE = re.compile(r"0[xX]([0-9a-fA-F]+)([iu]?)")


class _Tokens:
    """The tokens of a module (comments and blankspace dropped), with their offsets computed on demand."""

    def __init__(self, source: str) -> None:
        self.source = source
        self.toks: list[str] = []
        self.segments: list[tuple[int, int, int]] = []  # comment-free stretches: (start, end, index of first token)
        self._firsts: list[int] = []
        self._ends: dict[int, list[int]] = {}  # segment -> cumulative lengths of its raw matches

    def add_segment(self, start: int, end: int) -> int:
        """Tokenise source[start:end]; the index of its first token."""
        toks = self.toks
        first = len(toks)
        toks.extend(_TOKEN_RE.findall(self.source, start, end))
        while len(toks) > first and not toks[-1]:
            toks.pop()
        self.segments.append((start, end, first))
        self._firsts.append(first)
        return first

    def offset(self, index: int) -> int:
        """The offset in the source of token `index` (the end of the source for an index past the last token)."""
        if index >= len(self.toks) or not self.segments:
            return len(self.source)
        k = bisect.bisect_right(self._firsts, index) - 1
        start, end, first = self.segments[k]
        ends = self._ends.get(k)
        if ends is None:
            ends = self._ends[k] = list(itertools.accumulate(map(len, _RAW_TOKEN_RE.findall(self.source, start, end))))
        return start + ends[index - first] - len(self.toks[index])


class _Problems:
    """Reasons for inexactness, with line numbers; only the first few are kept in full."""

    def __init__(self, tokens: _Tokens) -> None:
        self.tokens = tokens
        self.items: list[str] = []
        self.dropped = 0

    def add(self, offset: int | None, message: str) -> None:
        if len(self.items) >= _MAX_PROBLEMS:
            self.dropped += 1
            return
        if offset is not None:
            message = f"line {self.tokens.source.count(chr(10), 0, offset) + 1}: {message}"
        self.items.append(message)

    def at(self, index: int, message: str) -> None:
        """A problem at token `index`."""
        self.add(self.tokens.offset(index) if len(self.items) < _MAX_PROBLEMS else None, message)

    def __bool__(self) -> bool:
        return bool(self.items)

    def result(self) -> tuple[str, ...]:
        if self.dropped:
            return (*self.items, f"... and {self.dropped} more")
        return tuple(self.items)


def _tokenize(source: str) -> tuple[_Tokens, _Problems]:
    """Split `source` at its comments, then each comment-free stretch into tokens."""
    tokens = _Tokens(source)
    problems = _Problems(tokens)
    pos, end = 0, len(source)
    while True:
        comment = _COMMENT_RE.search(source, pos)
        stop = end if comment is None else comment.start()
        first = tokens.add_segment(pos, stop)
        bad = _NOT_WGSL_RE.search(source, pos, stop)
        if bad is not None:
            problems.add(bad.start(), f"{_show(bad.group())} is not WGSL")
        if _NON_ASCII_RE.search(source, pos, stop) is not None:
            for index in range(first, len(tokens.toks)):
                tok = tokens.toks[index]
                if _IDENT_START_RE.match(tok) and not tok.isidentifier():
                    problems.at(index, f"{_show(tok)} is not a WGSL identifier")
        if comment is None:
            return tokens, problems
        pos = comment.end()
        if source[comment.start() + 1] == "/":
            continue
        depth = 1  # a block comment: they nest
        while depth:
            close = _BLOCK_RE.search(source, pos)
            if close is None:
                problems.add(comment.start(), "unterminated block comment")
                return tokens, problems
            pos = close.end()
            depth += 1 if source[close.start()] == "/" else -1


def _show(tok: str) -> str:
    """A token for a message: quoted, and shortened when long."""
    return repr(tok) if len(tok) <= 40 else repr(tok[:40]) + "..."


def _is_ident(tok: str) -> bool:
    return bool(tok) and tok[0] not in _NOT_IDENT_START


def _type_text(tokens: Iterable[str]) -> str:
    """Whitespace-normalised text of a type: tokens joined without spaces, one space after each comma."""
    return "".join(", " if t == "," else t for t in tokens).strip()


def _resolve_alias_text(text: str, aliases: Mapping[str, str]) -> str | None:
    """Follow `alias` declarations from a type name; None on a cycle or an overlong chain."""
    for _ in range(_MAX_ALIASES):
        target = aliases.get(text)
        if target is None:
            return text
        text = target
    return None


# ---------------------------------------------------------------------------------------------------------------
# Integer const expressions

_RANGES = {"abstract": (-(2**63), 2**63 - 1), "i32": (-(2**31), 2**31 - 1), "u32": (0, 2**32 - 1)}

_Int = tuple[int, str]  # (value, "abstract" | "i32" | "u32")


class _Undetermined(Exception):
    """A value that is not determined exactly (message: why)."""


@dataclasses.dataclass
class _Const:
    type_tokens: list[str] | None
    expr: list[str]


def _checked(value: int, kind: str) -> _Int:
    low, high = _RANGES[kind]
    if not low <= value <= high:
        raise _Undetermined(f"{value} overflows {kind}")
    return value, kind


def _concretize(a: _Int, kind: str) -> _Int:
    """Convert an abstract integer to `kind` (WGSL's automatic conversion); concrete types must match."""
    if a[1] == kind:
        return a
    if a[1] != "abstract":
        raise _Undetermined(f"{a[1]} used as {kind}")
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
        raise _Undetermined("division by zero")
    quotient = abs(x) // abs(y) * (1 if (x < 0) == (y < 0) else -1)  # truncating, as WGSL
    if op == "/":
        return _checked(quotient, kind)
    return _checked(x - y * quotient, kind)  # "%": the remainder takes the dividend's sign


class _Evaluator:
    """Evaluates integer const expressions over the module's `const` declarations, memoising each const."""

    def __init__(self, consts: Mapping[str, _Const | None], overrides: frozenset[str], aliases: Mapping[str, str]):
        self._consts = consts  # None: declared more than once
        self._overrides = overrides
        self._aliases = aliases
        self._memo: dict[str, _Int | str] = {}  # str: why the const is undetermined
        self._active: set[str] = set()

    def evaluate(self, tokens: Sequence[str], depth: int = 0) -> _Int:
        parser = _ExprParser(tokens, self)
        value = parser.additive(depth)
        if parser.pos != len(tokens):
            raise _Undetermined(f"cannot evaluate {_show(tokens[parser.pos])} in a const expression")
        return value

    def const(self, name: str, depth: int) -> _Int:
        known = self._memo.get(name)
        if isinstance(known, str):
            raise _Undetermined(known)
        if known is not None:
            return known
        if name in self._overrides:
            raise _Undetermined(f"{_show(name)} is an override, not a const")
        if name not in self._consts:
            raise _Undetermined(f"{_show(name)} is not a module-scope const")
        decl = self._consts[name]
        if decl is None:
            raise _Undetermined(f"{_show(name)} is declared more than once")
        if name in self._active:
            raise _Undetermined(f"const {_show(name)} refers to itself")
        self._active.add(name)
        try:
            value = self.evaluate(decl.expr, depth + 1)
            if decl.type_tokens is not None:
                declared = _resolve_alias_text(_type_text(decl.type_tokens), self._aliases)
                if declared not in ("i32", "u32"):
                    raise _Undetermined(f"const {_show(name)} is not an integer")
                value = _concretize(value, declared)
        except _Undetermined as exc:
            self._memo[name] = f"const {_show(name)}: {exc}"
            raise _Undetermined(f"const {_show(name)}: {exc}") from None
        finally:
            self._active.discard(name)
        self._memo[name] = value
        return value


class _ExprParser:
    """Recursive descent over one expression's tokens; every nesting level counts towards `_MAX_DEPTH`."""

    def __init__(self, tokens: Sequence[str], evaluator: _Evaluator) -> None:
        self.tokens = tokens
        self.pos = 0
        self.evaluator = evaluator

    def _peek(self) -> str:
        return self.tokens[self.pos] if self.pos < len(self.tokens) else ""

    def _expect(self, tok: str) -> None:
        if self._peek() != tok:
            raise _Undetermined(f"expected {_show(tok)} in a const expression")
        self.pos += 1

    def additive(self, depth: int) -> _Int:
        if depth > _MAX_DEPTH:
            raise _Undetermined("const expression nested too deeply")
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
                raise _Undetermined("const expression nested too deeply")
            if self._peek() == "-":
                raise _Undetermined("'--' in a const expression")
            value, kind = self.unary(depth + 1)
            if kind == "u32":
                raise _Undetermined("negation of a u32")
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
        if not _is_ident(tok):
            raise _Undetermined(f"cannot evaluate {_show(tok)} in a const expression" if tok else "missing value")
        if self._peek() != "(":
            return self.evaluator.const(tok, depth)
        if tok not in ("i32", "u32"):
            raise _Undetermined(f"cannot evaluate a call of {_show(tok)} in a const expression")
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
        raise _Undetermined(f"literal {tok[:_MAX_LITERAL]}... is too long")
    m = _DEC_RE.fullmatch(tok)
    if m is not None:
        value = int(m.group(1))
    else:
        m = _HEX_RE.fullmatch(tok)
        if m is None:
            raise _Undetermined(f"{_show(tok)} is not an integer literal")
        value = int(m.group(1), 16)
    return _checked(value, {"": "abstract", "i": "i32", "u": "u32"}[m.group(2)])


# ---------------------------------------------------------------------------------------------------------------
# Module-scope declarations

# Names the reflection interprets by spelling; a module declaring one of them is not reflected exactly.
_INTERPRETED = frozenset(
    {
        "storage",
        "uniform",
        "private",
        "workgroup",
        "function",
        "handle",
        "push_constant",
        "immediate",
        "task_payload",
        "read",
        "write",
        "read_write",
        "i32",
        "u32",
        "f32",
        "f16",
        "sampler",
        "sampler_comparison",
        "binding_array",
        "acceleration_structure",
    }
)
_NON_RESOURCE_SPACES = frozenset({"private", "workgroup", "function", "push_constant", "immediate", "task_payload"})
_ACCESS_MODES = frozenset({"read", "write", "read_write"})
_READ_HANDLES = frozenset({"sampler", "sampler_comparison", "acceleration_structure"})
_OPENERS = frozenset("([")
_CLOSERS = frozenset(")]")
_TYPE_BREAKERS = frozenset("{};=")

_Attrs = dict[str, list[tuple[int, int] | None]]  # attribute name -> argument token ranges (None: no parentheses)


@dataclasses.dataclass
class _Var:
    attrs: _Attrs
    template: list[str] | None  # the identifiers of `var<...>`; None without a template list
    name: str
    type_tokens: list[str]
    index: int  # of the token that starts the declaration


class _ParseError(Exception):
    """The module cannot be parsed further (message: why)."""

    def __init__(self, index: int, message: str) -> None:
        super().__init__(message)
        self.index = index


class _Module:
    """Pass 1: the module-scope declarations, as token ranges."""

    def __init__(self, toks: list[str], problems: _Problems) -> None:
        self.toks = toks
        self.problems = problems
        self.structs: list[tuple[str, list[tuple[str, list[str]]]]] = []
        self.aliases: dict[str, list[str]] = {}
        self.consts: dict[str, _Const | None] = {}
        self.overrides: set[str] = set()
        self.vars: list[_Var] = []
        self.names: set[str] = set()

    def _at(self, i: int) -> str:
        return self.toks[i] if i < len(self.toks) else ""

    def _expect(self, i: int, tok: str) -> int:
        if self._at(i) != tok:
            raise _ParseError(i, f"expected {_show(tok)}, found {_show(self._at(i) or 'end of module')}")
        return i + 1

    def _ident(self, i: int) -> str:
        tok = self._at(i)
        if not _is_ident(tok):
            raise _ParseError(i, f"expected a name, found {_show(tok or 'end of module')}")
        return tok

    def _declare(self, i: int, name: str) -> None:
        if name in self.names:
            self.problems.at(i, f"{_show(name)} is declared more than once")
        elif name in _INTERPRETED or name.startswith("texture_"):
            self.problems.at(i, f"the module declares {_show(name)}, a name the reflection interprets")
        self.names.add(name)

    def _find(self, i: int, tok: str) -> int:
        """Index of the next `tok` from i, which must come before any brace."""
        for j in range(i, len(self.toks)):
            t = self.toks[j]
            if t == tok:
                return j
            if t in ("{", "}"):
                break
        raise _ParseError(i, f"no {_show(tok)} ends this declaration")

    def _match(self, i: int, opener: str, closer: str) -> int:
        """Index of the token closing the `opener` at i."""
        if self._at(i + 2) == closer and self._at(i + 1) not in (opener, closer):  # the common `(value)`
            return i + 2
        depth = 0
        for j in range(i, len(self.toks)):
            t = self.toks[j]
            if t == opener:
                depth += 1
            elif t == closer:
                depth -= 1
                if depth == 0:
                    return j
        raise _ParseError(i, f"unbalanced {_show(opener)}")

    def _type_end(self, i: int, stops: frozenset[str]) -> int:
        """Index of the first of `stops` after the type starting at i (outside brackets)."""
        parens = angles = 0
        for j in range(i, len(self.toks)):
            t = self.toks[j]
            if parens == 0 and angles == 0 and t in stops:
                if j == i:
                    break
                return j
            if t in _TYPE_BREAKERS:
                break
            if t in _OPENERS:
                parens += 1
            elif t in _CLOSERS:
                parens -= 1
                if parens < 0:
                    break
            elif parens == 0 and t == "<":
                angles += 1
            elif parens == 0 and t == ">":
                angles -= 1
                if angles < 0:
                    break
        raise _ParseError(i, "cannot parse a type")

    def _attributes(self, i: int) -> tuple[_Attrs, int]:
        attrs: _Attrs = {}
        while self._at(i) == "@":
            name = self._ident(i + 1)
            i += 2
            args = None
            if self._at(i) == "(":
                close = self._match(i, "(", ")")
                args = (i + 1, close)
                i = close + 1
            attrs.setdefault(name, []).append(args)
        return attrs, i

    def parse(self) -> None:
        i, n = 0, len(self.toks)
        while i < n:
            tok = self.toks[i]
            if tok == ";":
                i += 1
                continue
            if tok in ("enable", "requires", "diagnostic"):
                i = self._find(i, ";") + 1
                continue
            start = i
            attrs, i = self._attributes(i)
            kw = self._at(i)
            if kw != "var" and ("group" in attrs or "binding" in attrs):
                self.problems.at(start, f"@group or @binding on {_show(kw or 'nothing')}, not on a var")
            if kw == "var":
                i = self._var(i, attrs)
            elif kw == "struct":
                i = self._struct(i)
            elif kw == "alias":
                name = self._ident(i + 1)
                self._declare(i + 1, name)
                end = self._type_end(self._expect(i + 2, "="), frozenset({";"}))
                self.aliases[name] = self.toks[i + 3 : end]
                i = end + 1
            elif kw == "const":
                i = self._const(i)
            elif kw == "override":
                name = self._ident(i + 1)
                self._declare(i + 1, name)
                self.overrides.add(name)
                i = self._find(i, ";") + 1
            elif kw == "fn":
                self._declare(i + 1, self._ident(i + 1))
                body = self._find(i, "{")
                i = self._match(body, "{", "}") + 1
            elif kw == "const_assert":
                i = self._find(i, ";") + 1
            else:
                raise _ParseError(i, f"unexpected {_show(kw or 'end of module')} at module scope")

    def _struct(self, i: int) -> int:
        name = self._ident(i + 1)
        self._declare(i + 1, name)
        i = self._expect(i + 2, "{")
        members: list[tuple[str, list[str]]] = []
        stops = frozenset({",", "}"})
        while self._at(i) != "}":
            _, i = self._attributes(i)
            member = self._ident(i)
            i = self._expect(i + 1, ":")
            end = self._type_end(i, stops)
            members.append((member, self.toks[i:end]))
            i = end + 1 if self.toks[end] == "," else end
        self.structs.append((name, members))
        return i + 1

    def _const(self, i: int) -> int:
        name = self._ident(i + 1)
        self._declare(i + 1, name)
        type_tokens = None
        j = i + 2
        if self._at(j) == ":":
            end = self._type_end(j + 1, frozenset({"="}))
            type_tokens = self.toks[j + 1 : end]
            j = end
        j = self._expect(j, "=")
        end = self._find(j, ";")
        self.consts[name] = _Const(type_tokens, self.toks[j:end]) if name not in self.consts else None
        return end + 1

    def _var(self, i: int, attrs: _Attrs) -> int:
        start = i
        i += 1
        template: list[str] | None = None
        if self._at(i) == "<":
            close = self._find(i, ">")
            template = []
            for j in range(i + 1, close):
                t = self.toks[j]
                expect_name = (j - i) % 2 == 1
                if (expect_name and not _is_ident(t)) or (not expect_name and t != ","):
                    template = None
                    self.problems.at(j, f"cannot parse the address space and access of a var: {_show(t)}")
                    break
                if expect_name:
                    template.append(t)
            else:
                if not template:
                    self.problems.at(i, "a var with an empty template list")
                    template = None
            if template is None:  # unknown: treat as a resource with undetermined access (see _Resolver.var)
                template = ["?"]
            i = close + 1
        name = self._ident(i)
        self._declare(i, name)
        i += 1
        type_tokens: list[str] = []
        if self._at(i) == ":":
            end = self._type_end(i + 1, frozenset({"=", ";"}))
            type_tokens = self.toks[i + 1 : end]
            i = end
        if self._at(i) == "=":
            i = self._find(i, ";")
        i = self._expect(i, ";")
        self.vars.append(_Var(attrs, template, name, type_tokens, start))
        return i


def _template_args(tokens: Sequence[str]) -> list[list[str]] | None:
    """The arguments of `name<a, b, ...>` (a trailing comma allowed); None if `tokens` is not of that shape."""
    if len(tokens) < 4 or tokens[1] != "<" or tokens[-1] != ">":
        return None
    args: list[list[str]] = [[]]
    parens = angles = 0
    for t in tokens[2:-1]:
        if t in _OPENERS:
            parens += 1
        elif t in _CLOSERS:
            parens -= 1
        elif parens == 0 and t == "<":
            angles += 1
        elif parens == 0 and t == ">":
            angles -= 1
        elif parens == 0 and angles == 0 and t == ",":
            if not args[-1]:
                return None
            args.append([])
            continue
        if parens < 0 or angles < 0:
            return None
        args[-1].append(t)
    if not args[-1]:
        args.pop()
    return args if args and parens == 0 and angles == 0 else None


class _Resolver:
    """Pass 2: the resource variables, with const expressions evaluated and aliases followed."""

    def __init__(self, module: _Module, problems: _Problems) -> None:
        self.module = module
        self.problems = problems
        self.alias_text = {name: _type_text(toks) for name, toks in module.aliases.items()}
        self.evaluator = _Evaluator(module.consts, frozenset(module.overrides), self.alias_text)
        self.values: dict[tuple[str, ...], int | str] = {}  # attribute argument -> value, or why it has none

    def _resolve_tokens(self, tokens: list[str]) -> list[str] | None:
        for _ in range(_MAX_ALIASES):
            if len(tokens) != 1 or tokens[0] not in self.module.aliases:
                return tokens
            tokens = self.module.aliases[tokens[0]]
        return None

    def _attr_value(self, var: _Var, attr: str) -> int | None:
        uses = var.attrs.get(attr)
        if uses is None:
            return None
        if len(uses) != 1 or uses[0] is None:
            self.problems.at(var.index, f"@{attr} of {_show(var.name)}: expected exactly one @{attr}(value)")
            return None
        start, end = uses[0]
        if end > start and self.module.toks[end - 1] == ",":
            end -= 1
        tokens = tuple(self.module.toks[start:end])
        value = self.values.get(tokens)
        if value is None:
            try:
                value, _ = self.evaluator.evaluate(tokens)
                if not 0 <= value < 2**32:
                    value = f"{value} is not a non-negative integer"
            except _Undetermined as exc:
                value = str(exc)
            self.values[tokens] = value
        if isinstance(value, str):
            self.problems.at(var.index, f"@{attr} of {_show(var.name)}: {value}")
            return None
        return value

    def _handle_access(self, var: _Var) -> str | None:
        tokens: list[str] | None = var.type_tokens
        for _ in range(2):  # a binding_array<T, N> holds one handle type
            tokens = self._resolve_tokens(tokens) if tokens else None
            if not tokens:
                return None
            head = tokens[0]
            if head.startswith("texture_storage_"):
                args = _template_args(tokens)
                if args is None or len(args) != 2 or len(args[1]) != 1 or args[1][0] not in _ACCESS_MODES:
                    return None
                return args[1][0]
            if head in _READ_HANDLES or head.startswith("texture_"):
                return "read"
            if head != "binding_array":
                return None
            args = _template_args(tokens)
            tokens = args[0] if args else None
        return None

    def var(self, var: _Var) -> Binding | None:
        """The Binding of a module-scope var; None if it is not a resource or its binding is undetermined."""
        template = var.template or []
        if template and template[0] in _NON_RESOURCE_SPACES:
            return None
        name = _show(var.name)
        group = self._attr_value(var, "group")
        binding = self._attr_value(var, "binding")
        if "group" not in var.attrs or "binding" not in var.attrs:
            self.problems.at(var.index, f"var {name} needs both @group and @binding")
        type_text = _type_text(var.type_tokens)
        space: str | None = None
        access: str | None = None
        if var.template is None:  # no address space: a texture, a sampler...
            space = "handle"
            access = self._handle_access(var)
        elif template[0] == "storage":
            space = "storage"
            if len(template) == 1:
                access = "read"
            elif len(template) == 2 and template[1] in ("read", "read_write"):
                access = template[1]
        elif template[0] == "uniform":
            space = "uniform"
            access = "read" if len(template) == 1 else None
        elif template[0] != "?":  # "?": a template list that did not parse, already reported
            self.problems.at(var.index, f"var {name}: unknown address space {_show(template[0])}")
        if space is not None and access is None:
            self.problems.at(var.index, f"var {name}: unknown access for {space} {_show(type_text)}")
        if not var.type_tokens:
            self.problems.at(var.index, f"var {name} has no type")
        elif self._resolve_tokens(var.type_tokens) is None:
            self.problems.at(var.index, f"var {name}: cannot resolve alias {_show(type_text)}")
        if group is None or binding is None or space is None:
            return None
        # an undetermined access has made the reflection inexact already; read_write is the safe guess to list
        return Binding(group, binding, var.name, space, access or "read_write", type_text)

    def structs(self) -> dict[str, tuple[Member, ...]]:
        out: dict[str, tuple[Member, ...]] = {}
        for name, members in self.module.structs:
            resolved = []
            for member, tokens in members:
                text = _type_text(tokens)
                if len(tokens) == 1:
                    text = _resolve_alias_text(text, self.alias_text) or text
                resolved.append(Member(member, text))
            out.setdefault(name, tuple(resolved))
        return out


def reflect(source: str) -> Reflection:
    """Reflect the resource bindings and structs of a WGSL module. Never raises; linear in `source`'s length."""
    problems = _Problems(_Tokens(source))
    try:
        tokens, problems = _tokenize(source)
        module = _Module(tokens.toks, problems)
        try:
            module.parse()
        except _ParseError as exc:
            problems.at(exc.index, f"{exc} (the rest of the module is not reflected)")
        resolver = _Resolver(module, problems)
        bindings = tuple(b for b in map(resolver.var, module.vars) if b is not None)
        structs = resolver.structs()
        aliases = resolver.alias_text
    except Exception as exc:  # a bug here must not take the daemon down: report "inexact"
        message = f"internal error while reflecting: {type(exc).__name__}: {_show(str(exc))}"
        return Reflection((), types.MappingProxyType({}), False, (*problems.result(), message))
    return Reflection(
        bindings,
        types.MappingProxyType(structs),
        not problems,
        problems.result(),
        types.MappingProxyType(aliases),
    )
