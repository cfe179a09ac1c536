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
from typing import TYPE_CHECKING, Any, Protocol

from gpud.backends.base import Buffer
from gpud_protocol.errors import InvalidArgument
from gpud_protocol.limits import DTYPE_SIZES
from gpud_protocol.ops import TensorInfo, layout_problem
from gpud_protocol.views import TensorView, contiguous_strides, dense_range, extent, is_contiguous, span

if TYPE_CHECKING:
    from gpud.runtime.runtime import DeviceRuntime
    from gpud.session.kernels import KernelRef


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
    """A session's name for a tensor, or a view of one: its memory seen with `shape`, from element
    `offset`, with `strides` (None: contiguous). Immutable: what every dispatch asks of it is
    computed once, here."""

    tensor: Tensor
    writable: bool
    shape: tuple[int, ...]
    offset: int = 0
    strides: tuple[int, ...] | None = None
    whole: bool = dataclasses.field(init=False)  # the whole tensor, contiguous (itself, or a reshape of it)
    info: TensorInfo = dataclasses.field(init=False)  # what an op's rule sees of it

    def __post_init__(self) -> None:
        tensor = self.tensor
        self.whole = not self.offset and self.strides is None and math.prod(self.shape) == math.prod(tensor.shape)
        self.info = TensorInfo(tensor.dtype, self.shape, self.offset, self.strides)

    def describe(self) -> str:
        return f"{self.tensor.dtype}{list(self.shape)} on device {self.tensor.device}"

    def dense_buffer(self, rt: DeviceRuntime) -> Buffer:
        """The memory of a contiguous view, for a copy or an upload (refused where the device's 4-byte
        copies would not move exactly its bytes); the tensor's buffer for the whole tensor."""
        if self.whole:
            return self.tensor.buffer
        itemsize = DTYPE_SIZES[self.tensor.dtype]
        try:
            first, nbytes = dense_range(self.offset, self.shape, self.steps, itemsize, math.prod(self.tensor.shape))
        except ValueError as exc:
            raise InvalidArgument(f"{self.describe()}: {exc}") from None
        return rt.view(self.tensor.buffer, first, nbytes)

    def span_buffer(self, rt: DeviceRuntime) -> Buffer:
        """The bytes a readback of the view sends (`views.span`): the client picks its elements out."""
        first, nbytes = span(self.offset, self.shape, self.steps, DTYPE_SIZES[self.tensor.dtype])
        return rt.view(self.tensor.buffer, first, nbytes)

    def bound_buffer(self, rt: DeviceRuntime, strided: bool) -> Buffer:
        """What a kernel is given: the tensor's buffer, whole for a kernel that reads the view through
        its scalars (`strided`); else the view's memory (checked dense and aligned by the caller)."""
        if strided or self.whole:
            return self.tensor.buffer
        itemsize = DTYPE_SIZES[self.tensor.dtype]
        return rt.view(self.tensor.buffer, self.offset * itemsize, math.prod(self.shape) * itemsize)

    @property
    def steps(self) -> tuple[int, ...]:
        return contiguous_strides(self.shape) if self.strides is None else self.strides


def view_of(handle: Handle, view: TensorView) -> Handle:
    """`handle`'s memory seen as `view` (hostile input: checked against the base's size here, where it
    is known; the codec bounded each field and refused negative strides)."""
    tensor = handle.tensor
    seen = f"a view {list(view.shape)} (offset {view.offset}, strides {list(view.strides)}) of {handle.describe()}"
    if not handle.whole:
        raise InvalidArgument(f"{seen}: views are made of a tensor's handle, not of a view's")
    elements = math.prod(tensor.shape)
    if any(stride < 0 for stride in view.strides) or view.offset < 0:
        raise InvalidArgument(f"{seen} has a negative stride or offset")
    if extent(view) > elements:
        raise InvalidArgument(f"{seen} reaches past its {elements} elements")
    strides = None if is_contiguous(view.shape, view.strides) else view.strides
    return Handle(tensor, handle.writable, view.shape, view.offset, strides)


def bind_views(args: list[Any], kernel: KernelRef, rt: DeviceRuntime) -> None:
    """Turn a dispatch's tensor arguments (Handles, checked against the kernel's rule) into the buffers
    the kernel is given. A kernel of the user's own indexes dense memory: it takes a view only where
    the op library's kernels do (contiguous, at an aligned offset)."""
    strided = kernel.builtin.strided if kernel.builtin is not None else ()
    position = 0
    for index, arg in enumerate(args):
        if type(arg) is Handle:
            if kernel.builtin is None and (problem := layout_problem(arg.info, f"tensor argument {position}")):
                raise InvalidArgument(f"kernel {kernel.entry}: {problem} (a kernel of your own indexes dense memory)")
            args[index] = arg.bound_buffer(rt, position in strided)
            position += 1
