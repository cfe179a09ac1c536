"""Pass 1: a module's module-scope declarations, as token ranges (function bodies skipped by brace matching)."""

from __future__ import annotations

import dataclasses

from gpud.backends.webgpu.wgsl.consts import Const
from gpud.backends.webgpu.wgsl.lexer import CLOSERS, OPENERS, Problems, is_ident, show

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
_TYPE_BREAKERS = frozenset("{};=")

_Attrs = dict[str, list[tuple[int, int] | None]]  # attribute name -> argument token ranges (None: no parentheses)


@dataclasses.dataclass
class Var:
    attrs: _Attrs
    template: list[str] | None  # the identifiers of `var<...>`; None without a template list
    name: str
    type_tokens: list[str]
    index: int  # of the token that starts the declaration


class ParseError(Exception):
    """The module cannot be parsed further (message: why)."""

    def __init__(self, index: int, message: str) -> None:
        super().__init__(message)
        self.index = index


class Module:
    """Pass 1: the module-scope declarations, as token ranges."""

    def __init__(self, toks: list[str], problems: Problems) -> None:
        self.toks = toks
        self.problems = problems
        self.structs: list[tuple[str, list[tuple[str, list[str]]]]] = []
        self.aliases: dict[str, list[str]] = {}
        self.consts: dict[str, Const | None] = {}
        self.overrides: set[str] = set()
        self.vars: list[Var] = []
        self.names: set[str] = set()

    def _at(self, i: int) -> str:
        return self.toks[i] if i < len(self.toks) else ""

    def _expect(self, i: int, tok: str) -> int:
        if self._at(i) != tok:
            raise ParseError(i, f"expected {show(tok)}, found {show(self._at(i) or 'end of module')}")
        return i + 1

    def _ident(self, i: int) -> str:
        tok = self._at(i)
        if not is_ident(tok):
            raise ParseError(i, f"expected a name, found {show(tok or 'end of module')}")
        return tok

    def _declare(self, i: int, name: str) -> None:
        if name in self.names:
            self.problems.at(i, f"{show(name)} is declared more than once")
        elif name in _INTERPRETED or name.startswith("texture_"):
            self.problems.at(i, f"the module declares {show(name)}, a name the reflection interprets")
        self.names.add(name)

    def _find(self, i: int, tok: str) -> int:
        """Index of the next `tok` from i, which must come before any brace."""
        for j in range(i, len(self.toks)):
            t = self.toks[j]
            if t == tok:
                return j
            if t in ("{", "}"):
                break
        raise ParseError(i, f"no {show(tok)} ends this declaration")

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
        raise ParseError(i, f"unbalanced {show(opener)}")

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
            if t in OPENERS:
                parens += 1
            elif t in CLOSERS:
                parens -= 1
                if parens < 0:
                    break
            elif parens == 0 and t == "<":
                angles += 1
            elif parens == 0 and t == ">":
                angles -= 1
                if angles < 0:
                    break
        raise ParseError(i, "cannot parse a type")

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
                self.problems.at(start, f"@group or @binding on {show(kw or 'nothing')}, not on a var")
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
                raise ParseError(i, f"unexpected {show(kw or 'end of module')} at module scope")

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
        self.consts[name] = Const(type_tokens, self.toks[j:end]) if name not in self.consts else None
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
                if (expect_name and not is_ident(t)) or (not expect_name and t != ","):
                    template = None
                    self.problems.at(j, f"cannot parse the address space and access of a var: {show(t)}")
                    break
                if expect_name:
                    template.append(t)
            else:
                if not template:
                    self.problems.at(i, "a var with an empty template list")
                    template = None
            if template is None:  # unknown: treat as a resource with undetermined access (see Resolver.var)
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
        self.vars.append(Var(attrs, template, name, type_tokens, start))
        return i
