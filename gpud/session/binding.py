"""A replay's bound tensors as checked (`graph_binds`), kept per instance (`graphs.Instance.bindings`)."""

from __future__ import annotations

from typing import Any

from gpud.backends.base import Buffer
from gpud.session.tensors import Handle


class Binding:
    """A replay's bound tensors as checked: the handles they were named by, their buffers, and the key
    of their plan in `Instance.plans` (made on first use, for the family's generation then)."""

    __slots__ = ("buffers", "handles", "key")

    def __init__(self, handles: tuple[Handle | None, ...], buffers: tuple[Buffer, ...]) -> None:
        self.handles = handles
        self.buffers = buffers
        self.key: tuple[Any, ...] | None = None


UNBOUND = Binding((), ())
