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

import types

from gpud.backends.webgpu.wgsl.lexer import Problems, Tokens, show, tokenize
from gpud.backends.webgpu.wgsl.model import Reflection
from gpud.backends.webgpu.wgsl.parser import Module, ParseError
from gpud.backends.webgpu.wgsl.resolver import Resolver


def reflect(source: str) -> Reflection:
    """Reflect the resource bindings and structs of a WGSL module. Never raises; linear in `source`'s length."""
    problems = Problems(Tokens(source))
    try:
        tokens, problems = tokenize(source)
        module = Module(tokens.toks, problems)
        try:
            module.parse()
        except ParseError as exc:
            problems.at(exc.index, f"{exc} (the rest of the module is not reflected)")
        resolver = Resolver(module, problems)
        bindings = tuple(b for b in map(resolver.var, module.vars) if b is not None)
        structs = resolver.structs()
        aliases = resolver.alias_text
    except Exception as exc:  # a bug here must not take the daemon down: report "inexact"
        message = f"internal error while reflecting: {type(exc).__name__}: {show(str(exc))}"
        return Reflection((), types.MappingProxyType({}), False, (*problems.result(), message))
    return Reflection(
        bindings,
        types.MappingProxyType(structs),
        not problems,
        problems.result(),
        types.MappingProxyType(aliases),
    )
