"""What a reflection returns: the module's resource bindings and structs, and whether it is exact."""

from __future__ import annotations

import dataclasses
import types
from collections.abc import Mapping

MAX_ALIASES = 64  # length of an alias chain


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
        resolved = resolve_alias_text(b.type, self._aliases)
        if resolved is None:
            return None
        members = self.structs.get(resolved)
        if members is not None:
            return members
        if resolved in _SCALARS:
            return (Member(b.name, resolved),)
        return None


def resolve_alias_text(text: str, aliases: Mapping[str, str]) -> str | None:
    """Follow `alias` declarations from a type name; None on a cycle or an overlong chain."""
    for _ in range(MAX_ALIASES):
        target = aliases.get(text)
        if target is None:
            return text
        text = target
    return None
