"""A session's kernels and dispatches: registering a kernel (a built-in one of the op library, or the
client's own), and checking and packing a dispatch once. A repeated dispatch comes from the decoder
with its entry of the memo, and what the entry holds is encoded as it is (`prepared`)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Sequence
from typing import Any

import gpud_protocol as proto
from gpud.ops import options as ops_options
from gpud.ops import source as ops_source
from gpud.runtime.runtime import Wait
from gpud.session.kernels import KernelRef
from gpud.session.state import SessionState
from gpud.session.tensors import Handle, bind_views, view_of
from gpud_protocol import TensorView
from gpud_protocol.errors import InvalidArgument, NotFound, PermissionDenied
from gpud_protocol.ops import KERNEL_BACKENDS, TensorInfo
from gpud_protocol.ops import PREFIX as OPS_PREFIX
from gpud_protocol.ops import spec_of as ops_spec_of

_TENSOR = int(proto.ArgKind.TENSOR)
_SCALAR_NAMES = {int(kind): name for kind, name in proto.SCALAR_NAMES.items()}


class Dispatching(SessionState):
    def _kernel(self, op: proto.RegisterKernel, _batch: proto.Batch) -> Wait | None:
        self._admit()
        existing = self.kernels.find(op.source, op.entry, op.options)
        if existing is not None and existing.handle != op.handle and op.handle not in self.kernels:
            self._new_handle(op.handle)  # the client uses the handle it chose: make it name the same kernel
            self.kernels.alias(op.handle, existing)
        if existing is not None:
            self._reply_kernel(op.seq, existing)
            return None
        if op.handle in self.handles or op.handle in self.kernels or op.handle in self.graphs:
            raise InvalidArgument(f"handle {op.handle} is in use")
        self.kernels.check_room()
        rt = self.runtimes[self.device]
        source, options, builtin = op.source, op.options, ops_spec_of(op.source)
        if builtin is not None:
            if op.entry != builtin.name:
                raise InvalidArgument(f"the built-in kernel {builtin.name} has entry point {builtin.name!r}")
            try:
                source = ops_source(builtin.family, rt.device.kind)
            except LookupError as exc:
                raise InvalidArgument(str(exc)) from None
            backends = KERNEL_BACKENDS.get(builtin.name, ())
            if rt.device.kind not in backends:
                raise InvalidArgument(
                    f"{builtin.name} is the op library's kernel for {' and '.join(backends)} only: the "
                    f"{rt.device.kind} backend has none (the op picks another kernel there)"
                )
            options = ops_options(builtin, rt.device.kind)
        elif op.source.startswith(OPS_PREFIX):
            raise NotFound(f"no built-in kernel {op.source[len(OPS_PREFIX) :]!r}")
        got = rt.program(source, op.entry, options)
        if isinstance(got, asyncio.Future):
            future = got
            return Wait(future, lambda: self._kernel_compiled(op, rt.index, future.result(), source, options, builtin))
        self._kernel_compiled(op, rt.index, got, source, options, builtin)
        return None

    def _prefetch(self, ops: Sequence[Any]) -> None:
        """Start compiling the op library's kernels that `ops` register: a session registers in order, one
        compile at a time, where the device's compile worker can run several (a MiniLM forward asks for
        six families at once). Built-in kernels only: their sources are the daemon's own, a bounded set."""
        rt = self.runtimes[self.device]
        kind = rt.device.kind
        for op in ops:
            if type(op) is not proto.RegisterKernel or (builtin := ops_spec_of(op.source)) is None:
                continue
            known = self.kernels.find(op.source, op.entry, op.options) is not None
            if kind in KERNEL_BACKENDS.get(builtin.name, ()) and op.entry == builtin.name and not known:
                with contextlib.suppress(LookupError):  # no source for this backend: the op says so, in order
                    rt.program(ops_source(builtin.family, kind), op.entry, ops_options(builtin, kind))

    def _kernel_compiled(
        self,
        op: proto.RegisterKernel,
        device: int,
        program: Any,
        source: str,
        options: proto.KernelOptions,
        builtin: Any,
    ) -> Wait | None:
        key = (op.source, op.entry, op.options)
        kernel = self.kernels.add(op.handle, key, source, op.entry, options, device, program, builtin)
        self._reply_kernel(op.seq, kernel)
        return None

    def _reply_kernel(self, seq: int, kernel: KernelRef) -> None:
        program = kernel.first
        written = kernel.writes(program)
        writes = None if written is None else sorted(written)
        self._reply(seq, handle=kernel.handle, writes=writes, unchecked=list(program.unchecked))

    def _repeat(self, op: proto.Memoized) -> Wait | None:
        """A dispatch of the memo: what was checked and packed is kept in its entry (until a handle goes)."""
        entry = op.entry
        kept = entry.prepared
        if kept is None:
            kept = self._prepare(proto.Dispatch(op.seq, *entry.fields), entry)
            if type(kept) is Wait:
                return kept
        prepared, rt, _handles = kept
        if rt.saturated:
            return Wait(rt.unsaturated(), lambda: self._repeat(op))
        rt.dispatch(prepared, self)
        return None

    def _dispatch(self, op: proto.Dispatch, _batch: proto.Batch | None = None) -> Wait | None:
        """A dispatch the decoder did not memoize: checked and packed for this once."""
        kept = self._prepare(op, None)
        if type(kept) is Wait:
            return kept
        prepared, rt, _handles = kept
        if rt.saturated:
            return Wait(rt.unsaturated(), lambda: self._dispatch(op))
        rt.dispatch(prepared, self)
        return None

    def _prepare(self, op: proto.Dispatch, entry: proto.DispatchEntry | None) -> Any:
        kernel = self.kernels.get(op.kernel)
        if kernel is None:
            raise NotFound(self.kernels.unknown(op.kernel))
        if kernel.early:  # its early reads are safe in a recorded graph only (graph_record)
            raise InvalidArgument(kernel.early_problem(kernel.early[0], "a dispatch outside a replay graph"))
        handles = self.handles
        args: list[Any] = []
        tensor_handles: list[int] = []
        read_only: list[tuple[int, Handle]] = []
        infos: list[TensorInfo] = []
        device = -1
        for arg in op.args:
            kind, value = arg
            if kind == _TENSOR:
                if type(value) is TensorView:
                    handle_id = value.handle
                    found = handles.get(handle_id)
                    if found is None:
                        raise NotFound(f"unknown tensor handle {handle_id}")
                    handle = view_of(found, value)
                else:
                    handle_id = value  # type: ignore[assignment]  # the codec made it an int
                    found = handles.get(handle_id)
                    if found is None:
                        raise NotFound(f"unknown tensor handle {handle_id}")
                    handle = found
                if device == -1:
                    device = handle.tensor.device
                elif handle.tensor.device != device:
                    raise InvalidArgument(
                        f"tensor argument {len(tensor_handles)} is on device {handle.tensor.device}, "
                        f"the ones before it on device {device}: copy it first (gpu.copy)"
                    )
                if not handle.writable:
                    read_only.append((len(tensor_handles), handle))
                tensor_handles.append(handle_id)
                args.append(handle)  # its buffer once the checks passed (`bind_views`)
                infos.append(handle.info)
            else:
                args.append(arg)
        scalar_args = [arg for arg in op.args if arg[0] != _TENSOR]
        values: list[int | float] = [value for _kind, value in scalar_args]  # type: ignore[misc]  # not views
        scalars = tuple([_SCALAR_NAMES[kind] for kind, _value in scalar_args])
        device = self.device if device == -1 else device
        rt = self.runtimes[device]
        program = kernel.programs.get(device)
        if program is None:
            got = rt.program(kernel.source, kernel.entry, kernel.options)
            if isinstance(got, asyncio.Future):
                future = got

                def compiled() -> Wait | None:
                    kernel.programs[device] = future.result()
                    return self._dispatch(op) if entry is None else self._repeat(proto.Memoized(op.seq, entry))

                return Wait(future, compiled)
            program = kernel.programs[device] = got
        kernel.check_arguments(program, len(tensor_handles), scalars)
        kernel.check_op(infos, values)
        written = kernel.writes(program)
        for position, handle in read_only:
            if written is None or position in written or position in (op.writes or ()):
                raise PermissionDenied(kernel.writes_read_only(position, handle.tensor.name, values))
        bind_views(args, kernel, rt)
        prepared = rt.prepare(program, op.grid, args)
        handle_ids = tuple(tensor_handles)
        self.touched.add(device)
        if entry is None:
            return (prepared, rt, handle_ids)
        return self._prepared.add(entry, prepared, rt, handle_ids)
