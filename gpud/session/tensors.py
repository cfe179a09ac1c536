"""Tensors and the handles sessions hold on them.

A `Tensor` is a device buffer with dtype and shape and a reference count: each session handle that
names it holds one reference, and a published name holds one more. The buffer is released (after
its last use completes) when the count drops to zero, so a resident tensor outlives the session
that made it and its memory is held once however many sessions open it.

Quota: a tensor is charged to the session that allocated it while that session holds a handle to
it or has it published; it stops counting when neither holds (or the session ends), and from then
on only the resident store's daemon-wide bounds count it.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Protocol

from gpud.backends.base import Buffer
from gpud_protocol.errors import InvalidArgument
from gpud_protocol.views import TensorView, extent, is_contiguous


class Charged(Protocol):
    """The session a tensor is charged to."""

    id: str

    def uncharge_if_unheld(self, tensor: Tensor) -> None: ...


@dataclasses.dataclass(eq=False)
class Tensor:
    buffer: Buffer
    dtype: str
    shape: tuple[int, ...]
    charged_to: Charged | None = None
    refs: int = 1
    name: str | None = None  # set while published
    mode: str = "rw"  # the publisher's mode for other sessions
    publisher: str = ""  # id of the session that published it

    @property
    def nbytes(self) -> int:
        return self.buffer.nbytes

    @property
    def device(self) -> int:
        return self.buffer.device

    def describe(self) -> str:
        return f"{self.dtype}{list(self.shape)} on device {self.device}"


@dataclasses.dataclass(eq=False, slots=True)
class Handle:
    """A session's name for a tensor; a reshaped handle sees the same memory with its own shape."""

    tensor: Tensor
    writable: bool
    shape: tuple[int, ...]

    def describe(self) -> str:
        return f"{self.tensor.dtype}{list(self.shape)} on device {self.tensor.device}"


def view_of(handle: Handle, view: TensorView) -> Handle:
    """`handle`'s memory seen as `view` (hostile input: checked against the base's size here, where it
    is known). Only whole contiguous views (reshapes) are taken for now."""
    tensor = handle.tensor
    seen = f"a view {list(view.shape)} (offset {view.offset}, strides {list(view.strides)}) of {handle.describe()}"
    elements = math.prod(tensor.shape)
    if extent(view) > elements:
        raise InvalidArgument(f"{seen} reaches past its {elements} elements")
    if not is_contiguous(view.shape, view.strides):
        raise InvalidArgument(f"{seen} is not contiguous: only reshapes are supported (no strided views yet)")
    if view.offset or math.prod(view.shape) != elements:
        raise InvalidArgument(f"{seen} is part of the tensor: only whole-tensor views (reshapes) are supported")
    return Handle(tensor, handle.writable, view.shape)
