"""Pass 2: each resource variable's group, binding, address space and access, and every struct's members."""

from __future__ import annotations

from collections.abc import Sequence

from gpud.backends.webgpu.wgsl.consts import Evaluator, Undetermined
from gpud.backends.webgpu.wgsl.lexer import CLOSERS, OPENERS, Problems, show, type_text
from gpud.backends.webgpu.wgsl.model import MAX_ALIASES, Binding, Member, resolve_alias_text
from gpud.backends.webgpu.wgsl.parser import Module, Var

_NON_RESOURCE_SPACES = frozenset({"private", "workgroup", "function", "push_constant", "immediate", "task_payload"})
_ACCESS_MODES = frozenset({"read", "write", "read_write"})
_READ_HANDLES = frozenset({"sampler", "sampler_comparison", "acceleration_structure"})


def _template_args(tokens: Sequence[str]) -> list[list[str]] | None:
    """The arguments of `name<a, b, ...>` (a trailing comma allowed); None if `tokens` is not of that shape."""
    if len(tokens) < 4 or tokens[1] != "<" or tokens[-1] != ">":
        return None
    args: list[list[str]] = [[]]
    parens = angles = 0
    for t in tokens[2:-1]:
        if t in OPENERS:
            parens += 1
        elif t in CLOSERS:
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


class Resolver:
    """Pass 2: the resource variables, with const expressions evaluated and aliases followed."""

    def __init__(self, module: Module, problems: Problems) -> None:
        self.module = module
        self.problems = problems
        self.alias_text = {name: type_text(toks) for name, toks in module.aliases.items()}
        self.evaluator = Evaluator(module.consts, frozenset(module.overrides), self.alias_text)
        self.values: dict[tuple[str, ...], int | str] = {}  # attribute argument -> value, or why it has none

    def _resolve_tokens(self, tokens: list[str]) -> list[str] | None:
        for _ in range(MAX_ALIASES):
            if len(tokens) != 1 or tokens[0] not in self.module.aliases:
                return tokens
            tokens = self.module.aliases[tokens[0]]
        return None

    def _attr_value(self, var: Var, attr: str) -> int | None:
        uses = var.attrs.get(attr)
        if uses is None:
            return None
        if len(uses) != 1 or uses[0] is None:
            self.problems.at(var.index, f"@{attr} of {show(var.name)}: expected exactly one @{attr}(value)")
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
            except Undetermined as exc:
                value = str(exc)
            self.values[tokens] = value
        if isinstance(value, str):
            self.problems.at(var.index, f"@{attr} of {show(var.name)}: {value}")
            return None
        return value

    def _handle_access(self, var: Var) -> str | None:
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

    def var(self, var: Var) -> Binding | None:
        """The Binding of a module-scope var; None if it is not a resource or its binding is undetermined."""
        template = var.template or []
        if template and template[0] in _NON_RESOURCE_SPACES:
            return None
        name = show(var.name)
        group = self._attr_value(var, "group")
        binding = self._attr_value(var, "binding")
        if "group" not in var.attrs or "binding" not in var.attrs:
            self.problems.at(var.index, f"var {name} needs both @group and @binding")
        declared = type_text(var.type_tokens)
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
            self.problems.at(var.index, f"var {name}: unknown address space {show(template[0])}")
        if space is not None and access is None:
            self.problems.at(var.index, f"var {name}: unknown access for {space} {show(declared)}")
        if not var.type_tokens:
            self.problems.at(var.index, f"var {name} has no type")
        elif self._resolve_tokens(var.type_tokens) is None:
            self.problems.at(var.index, f"var {name}: cannot resolve alias {show(declared)}")
        if group is None or binding is None or space is None:
            return None
        # an undetermined access has made the reflection inexact already; read_write is the safe guess to list
        return Binding(group, binding, var.name, space, access or "read_write", declared)

    def structs(self) -> dict[str, tuple[Member, ...]]:
        out: dict[str, tuple[Member, ...]] = {}
        for name, members in self.module.structs:
            resolved = []
            for member, tokens in members:
                text = type_text(tokens)
                if len(tokens) == 1:
                    text = resolve_alias_text(text, self.alias_text) or text
                resolved.append(Member(member, text))
            out.setdefault(name, tuple(resolved))
        return out
