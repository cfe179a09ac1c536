"""What every family of ops uses: kernels registered on first use, outputs, checks, dispatches."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import gpud_protocol as proto
from gpud_client.dtypes import name_of
from gpud_client.errors import InvalidArgument, PermissionDenied
from gpud_client.values import Kernel, f32, i32, u32
from gpud_protocol.ops import KERNELS, OpError, TensorInfo
from gpud_protocol.views import is_contiguous

if TYPE_CHECKING:
    from gpud_client.client import Client
    from gpud_client.graphs import Graph
    from gpud_client.tensor import Tensor


class OpsBase:
    def __init__(self, client: Client) -> None:
        self._client = client
        self._kernels: dict[str, Kernel] = {}

    def _kernel(self, name: str) -> Kernel:
        """The built-in kernel `name`, registered on first use without a round trip."""
        kernel = self._kernels.get(name)
        if kernel is None:
            client = self._client
            spec = KERNELS[name]
            handle, seq = next(client._handles), client._next_seq()
            op = proto.RegisterKernel(seq, handle, proto.ops.PREFIX + name, name, proto.KernelOptions())
            client._queue(op, request=seq)
            client._connection.expect(seq)
            kernel = self._kernels[name] = Kernel(handle, name, spec.writes)
        return kernel

    def _out(self, out: Any, shape: tuple[int, ...], dtype: str, like: Any, graph: Graph | None) -> Any:
        """The output tensor: `out` as given (checked), else a new one on the device of `like`."""
        if out is not None:
            return out
        if graph is not None:
            return graph.empty(shape, dtype)
        device = getattr(like, "device", None)
        return self._client.empty(shape, dtype, device=device)

    def _run(
        self,
        name: str,
        grid: tuple[int, int, int],
        tensors: Sequence[Any],
        scalars: Sequence[Any],
        graph: Graph | None,
    ) -> None:
        """Check the call against the kernel's rule, then queue (or record) its dispatch. Errors,
        here or later from the daemon, name the op the user called (`exc.op`: "add", not "dispatch")."""
        spec = KERNELS[name]
        values = [s.value if hasattr(s, "value") else s for s in scalars]
        op = spec.op_name(values)
        for position in spec.writes:
            written = tensors[position]
            if getattr(written, "mode", "rw") == "ro":
                raise PermissionDenied(
                    f"{spec.tensors[position]} is a read-only resident tensor, which {name} would write: "
                    "write into a tensor of your own",
                    op=op,
                )
            if any(same_memory(t, written) for i, t in enumerate(tensors) if i != position):
                raise InvalidArgument(f"out is also an input; ops do not run in place ({name})", op=op)
        infos = [_info(t) for t in tensors]
        try:
            spec.verify(infos, values)
        except OpError as exc:
            raise InvalidArgument(f"{exc} ({name})", op=op) from None
        args = [*tensors, *(_scalar(kind, v) for (_, kind), v in zip(spec.scalars, scalars, strict=True))]
        kernel = self._kernel(name)
        if graph is not None:
            graph.dispatch(kernel, grid, args)
        else:
            client = self._client
            client.dispatch(kernel, grid, args)
            client._connection.name_op(client._last_seq, op)


def _info(tensor: Any) -> TensorInfo:
    """What the op's rule sees: dtype, shape, and a view's offset and strides (None: contiguous)."""
    dtype = name_of(tensor.dtype)
    shape = tuple(tensor.shape)
    strides = getattr(tensor, "strides", None)  # a recording's tensors have none: dense
    if strides is not None and is_contiguous(shape, strides):
        strides = None
    return TensorInfo(dtype, shape, getattr(tensor, "offset", 0), strides)


def _scalar(kind: str, value: Any) -> Any:
    if hasattr(value, "kind") and hasattr(value, "graph"):  # a graph scalar: its kind is declared
        return value
    return {"f32": f32, "i32": i32, "u32": u32}[kind](value)


def same_memory(a: Any, b: Any) -> bool:
    """One tensor, or views of one (a session's tensors and a recording's alike)."""
    return getattr(a, "base", a) is getattr(b, "base", b)


def dtype_name(tensor: Tensor | Any) -> str:
    return name_of(tensor.dtype)
