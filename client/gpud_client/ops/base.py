"""What every family of ops uses: kernels registered on first use, outputs, checks, dispatches.

A call is checked once per signature: what the op's rule decides (the kernel, its grid, the output's
shape and dtype, the scalars) depends only on its operands' dtypes, shapes and layouts
(`TensorInfo`) and the call's parameters, so it is kept (`Launch`, `Planned`) by those, and a call
like an earlier one costs a lookup, the output's allocation and one packed dispatch. What depends on
the tensors themselves (their session, a freed one, a read-only one written, an output that is also
an input) is checked at every call.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, NamedTuple, TypeVar

import gpud_protocol as proto
from gpud_client import packing
from gpud_client.dtypes import dtype_name
from gpud_client.errors import InvalidArgument, PermissionDenied
from gpud_client.memo import Memo
from gpud_client.operands import foreign, not_a_tensor
from gpud_client.ops.constants import Constants
from gpud_client.values import F32, Kernel, Scalar
from gpud_protocol.ops import KERNELS, KernelSpec, OpError, TensorInfo
from gpud_protocol.ops.matvec_ro import EARLY
from gpud_protocol.views import is_contiguous
from gpud_protocol.wire import pack

if TYPE_CHECKING:
    from gpud_client.client_base import ClientBase
    from gpud_client.graphs import Graph

PLANS_KEPT = 4096  # checked calls kept per client (a model has a few hundred distinct ones)
P = TypeVar("P")  # a plan: Planned, or an op's own (attention's SplitPlan)


class Launch(NamedTuple):
    """One checked dispatch of a built-in kernel, the same for every call with these operands' infos and
    these scalars."""

    name: str  # the kernel
    grid: tuple[int, int, int]
    op: str  # the op the user called, as errors name it
    scalars: tuple[Any, ...]  # the arguments after the tensors: `Scalar`s (or a recording's scalars)
    head: bytes  # packed: the grid and the arguments' count (gpud_client.packing)
    tail: bytes  # packed: the scalars and writes; b"" when a recording's scalar is among them


class Planned(NamedTuple):
    """An op's call, checked: its output and its dispatch."""

    shape: tuple[int, ...]  # the output's (a new tensor's, when no out= is given)
    dtype: str
    launch: Launch | None  # None: nothing to compute (an empty output)


class OpsBase:
    def __init__(self, client: ClientBase) -> None:
        self._client = client
        self._kernels: dict[str, Kernel] = {}
        self._packed_kernels: dict[str, bytes] = {}  # a kernel's handle, packed, by name (every dispatch's)
        self._plans: Memo[tuple[Any, ...], Any] = Memo(PLANS_KEPT)  # Planned, or Launch (`_run`), by call
        self._constants = Constants(client)  # numbers given as operands, as 0-d tensors

    def _software(self, like: Any) -> bool:
        """Whether `like` (a tensor, or a recording's) lives on a WebGPU adapter that runs on the CPU
        (lavapipe): some ops have kernels written for it (matmul_nk, the rows family)."""
        return self._client.backend == "webgpu" and bool(self._device_info(like).get("software"))

    def _device_info(self, like: Any) -> dict[str, Any]:
        """The daemon's info of the device `like` lives on ({} where it says nothing)."""
        index = getattr(like, "device", None)
        devices = self._client.devices
        where = self._client.device if index is None else int(index)
        return devices[where] if 0 <= where < len(devices) else {}

    def _capability(self, like: Any) -> str:
        """The compute capability of the device `like` lives on ("9.0"), "" where the daemon does not say."""
        return str(self._device_info(like).get("compute_capability", ""))

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

    def _packed_kernel(self, name: str) -> bytes:
        """The handle of `_kernel(name)`, packed as a dispatch names it."""
        packed = self._packed_kernels.get(name)
        if packed is None:
            packed = self._packed_kernels[name] = pack(self._kernel(name).handle)
        return packed

    def _out(self, out: Any, shape: tuple[int, ...], dtype: str, like: Any, graph: Graph | None) -> Any:
        """The output tensor: `out` as given (checked), else one on the device of `like` (pooled or new:
        every kernel writes its whole output, so a pooled one's old bytes are never read)."""
        if out is not None:
            return out
        if graph is not None:
            return graph.empty(shape, dtype)
        return self._client._output(shape, dtype, getattr(like, "device", None))

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
        if graph is not None:  # a recording's scalars may be among the scalars: nothing kept
            self._launch(self._check(name, grid, tensors, scalars), tensors, graph, fresh=True)
            return
        key = (name, grid, *[info_of(t) for t in tensors], *exact(scalars))
        try:
            launch = self._plans.get(key)
        except TypeError:  # an unhashable scalar: checked, not kept
            self._launch(self._check(name, grid, tensors, scalars), tensors, None, fresh=True)
            return
        if launch is None:
            launch = self._plans.keep(key, self._check(name, grid, tensors, scalars))
            self._launch(launch, tensors, None, fresh=True)  # `_check` checked the writes
        else:
            self._launch(launch, tensors, None, fresh=False)

    def _check(self, name: str, grid: tuple[int, int, int], tensors: Sequence[Any], scalars: Sequence[Any]) -> Launch:
        """The call checked against the kernel's rule, as a `Launch`. `tensors` may hold, for an
        output still to be made, its `TensorInfo`."""
        spec = KERNELS[name]
        values = [s.value if hasattr(s, "value") else s for s in scalars]
        op = spec.op_name(values)
        check_writes(spec, op, tensors)
        infos = [info_of(t) for t in tensors]
        try:
            spec.verify(infos, values)
        except OpError as exc:
            raise InvalidArgument(f"{exc} ({name})", op=op) from None
        args = tuple(scalar_of(kind, v) for (_, kind), v in zip(spec.scalars, scalars, strict=True))
        recorded = any(type(a) is not Scalar for a in args)
        tail = b"" if recorded else packing.dispatch_tail(args)
        return Launch(name, grid, op, args, packing.dispatch_head(grid, len(tensors) + len(args)), tail)

    def _launch(self, launch: Launch, tensors: Sequence[Any], graph: Graph | None, fresh: bool) -> None:
        """Queue (or record) `launch` with `tensors`; `fresh`: what it writes was checked for this call
        (or just made), else it is checked here."""
        if not fresh:
            check_writes(KERNELS[launch.name], launch.op, tensors)
        if graph is not None:
            graph.dispatch(self._kernel(self._recorded(launch.name, tensors)), launch.grid, [*tensors, *launch.scalars])
            return
        self._queue_dispatch(launch, tensors)

    def _recorded(self, name: str, tensors: Sequence[Any]) -> str:
        """The kernel a graph records: on CUDA, with a weight that is a read-only resident, the one that
        starts reading it while the kernel before finishes (gpud_protocol.ops.matvec_ro), else `name`."""
        early = EARLY.get(name)
        if early is None or self._client.backend != "cuda":
            return name
        return early if getattr(tensors[KERNELS[early].early[0]], "mode", "rw") == "ro" else name

    def _queue_dispatch(self, launch: Launch, tensors: Sequence[Any], made: bytes = b"") -> None:
        """Queue `launch`'s dispatch of `tensors` (checked), then `made` (packed: an output just made)."""
        kernel = self._packed_kernels.get(launch.name) or self._packed_kernel(launch.name)
        client = self._client
        client._queue_launch(kernel, launch.head, launch.tail, tensors, made, launch.op)

    def _plan(self, key: tuple[Any, ...], make: Callable[..., P], *args: Any) -> P:
        """The plan of a call (`make(*args)`), kept by `key` (its operands' infos and parameters)."""
        try:
            plan: P | None = self._plans.get(key)
        except TypeError:  # an unhashable parameter (a 0-d array...): checked, not kept
            return make(*args)
        if plan is None:
            plan = self._plans.keep(key, make(*args))
        return plan

    def _execute(self, plan: Planned, inputs: list[Any], out: Any, like: Any, graph: Graph | None) -> Any:
        """Run a planned call: its output (`out`, else a tensor on the device of `like`, pooled or new),
        then its dispatch of `inputs` and the output."""
        if out is not None:
            result = out
        elif graph is not None:
            result = graph.empty(plan.shape, plan.dtype)
        else:
            client = self._client
            result = client._output(plan.shape, plan.dtype, getattr(like, "device", None))
            launch = plan.launch
            if launch is not None:  # `_queue_dispatch` of a new output (what it writes was just made), inlined
                kernel = self._packed_kernels.get(launch.name) or self._packed_kernel(launch.name)
                client._queue_launch(kernel, launch.head, launch.tail, inputs, result._packed, launch.op)
            return result
        if plan.launch is not None:
            inputs.append(result)
            self._launch(plan.launch, inputs, graph, fresh=out is None)
        return result


def check_writes(spec: KernelSpec, op: str, tensors: Sequence[Any]) -> None:
    """Refuse, at the call, writing a read-only tensor, or an output that is also an input."""
    for position in spec.writes:
        written = tensors[position]
        if getattr(written, "mode", "rw") == "ro":
            raise PermissionDenied(
                f"{spec.tensors[position]} is a read-only resident tensor, which {spec.name} would write: "
                "write into a tensor of your own",
                op=op,
            )
        memory = getattr(written, "base", written)  # `same_memory`, inlined: every call with out= comes here
        for i, t in enumerate(tensors):
            if i != position and getattr(t, "base", t) is memory:
                raise InvalidArgument(f"out is also an input; ops do not run in place ({spec.name})", op=op)


def info_of(tensor: Any) -> TensorInfo:
    """What the op's rule sees of a tensor (a session's, a recording's, or an output's info)."""
    try:
        info: TensorInfo = tensor.info
        return info
    except AttributeError:
        return tensor if type(tensor) is TensorInfo else _info(tensor)


def _info(tensor: Any) -> TensorInfo:
    """What the op's rule sees: dtype, shape, and a view's offset and strides (None: contiguous)."""
    if foreign(tensor):
        raise not_a_tensor(tensor)
    dtype = dtype_name(tensor)
    shape = tuple(tensor.shape)
    strides = getattr(tensor, "strides", None)  # a recording's tensors have none: dense
    if strides is not None and is_contiguous(shape, strides):
        strides = None
    return TensorInfo(dtype, shape, getattr(tensor, "offset", 0), strides)


def exact(values: Sequence[Any]) -> tuple[Any, ...]:
    """Call parameters as a key (see `signed`)."""
    return tuple([signed(v) for v in values])


def signed(value: Any) -> Any:
    """A call's parameter as part of a key: a zero with its sign (== does not tell -0.0 from 0.0, whose
    bytes and products differ); anything else as it is (what is not a number, the op's check refuses)."""
    try:
        if value or value is None or type(value) is int:  # (None: a default, as `scale`; no exception raised)
            return value
        return (value, math.copysign(1.0, value))
    except (TypeError, ValueError):  # not a number (an array...)
        return value


def scalar_of(kind: str, value: Any) -> Any:
    """`value` as a kernel's scalar of `kind` ("f32", "i32", "u32"); a graph scalar as it is (its kind is
    declared)."""
    if hasattr(value, "kind") and hasattr(value, "graph"):
        return value
    code = int(proto.SCALAR_KINDS[kind])
    return Scalar(code, float(value) if code == F32 else int(value))


def same_memory(a: Any, b: Any) -> bool:
    """One tensor, or views of one (a session's tensors and a recording's alike)."""
    return getattr(a, "base", a) is getattr(b, "base", b)


def of_rows(graph: Any) -> bool:
    """Whether `graph` is a row-independent recording (`gpu.graph(name, rows=True)` or `slots=`): its ops
    must compute a row as they would alone, whatever the instance's rows."""
    return graph is not None and bool(getattr(graph, "rows", False))
