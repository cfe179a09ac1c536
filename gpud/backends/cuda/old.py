"""CUDA backend (cuda-python driver API, CUDA C through NVRTC).

Kernel convention: an `extern "C" __global__` entry point; tensor arguments are device pointers and
scalars are 4-byte f32/i32/u32 values, in the order of its parameter list; `options.block` (threads
per block) is required.

A CUDA stream is already an asynchronous queue, so encoding a launch or a copy means putting it on
the backend's one non-blocking stream right away. A submit records an event; one completion thread
waits on the events in order and hands each completion back to the event loop, which never blocks
on the GPU. Compiled images are cached in memory (the base LRU) and on disk, named by a hash of the
exact kernel key, which includes the target architecture and the NVRTC version.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import dataclasses
import hashlib
import logging
import os
import queue
import re
import struct
import tempfile
import threading
import time
import weakref
from collections.abc import Sequence
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from gpud.backends.base import Arg, Backend, Buffer, Done, Kernel, Prepared, kernel_key, settle
from gpud.cache import LruCache
from gpud.config import Config
from gpud.pools import StagingPool
from gpud_protocol import ArgKind, KernelOptions
from gpud_protocol.errors import CompileError, DeviceLost, GpudError, InvalidArgument, OutOfMemory

try:
    from cuda.bindings import driver as cu
    from cuda.bindings import nvrtc
except ImportError as exc:  # only imported when the cuda backend is selected
    raise ImportError("the cuda backend needs cuda-python: pip install 'cuda-bindings>=12.6'") from exc

log = logging.getLogger(__name__)

_E = cu.CUresult
# After these the context is unusable: every later call fails with them too ("sticky" errors).
_STICKY_NAMES = """
    ILLEGAL_ADDRESS LAUNCH_FAILED ILLEGAL_INSTRUCTION MISALIGNED_ADDRESS HARDWARE_STACK_ERROR INVALID_ADDRESS_SPACE
    INVALID_PC ASSERT ECC_UNCORRECTABLE NVLINK_UNCORRECTABLE LAUNCH_TIMEOUT UNKNOWN CONTAINED TENSOR_MEMORY_LEAK
    EXTERNAL_DEVICE CONTEXT_IS_DESTROYED INVALID_CONTEXT DEINITIALIZED NOT_INITIALIZED NO_DEVICE DEVICE_UNAVAILABLE
    SYSTEM_NOT_READY SYSTEM_DRIVER_MISMATCH MPS_CONNECTION_FAILED MPS_RPC_FAILURE MPS_SERVER_NOT_READY
    MPS_CLIENT_TERMINATED
"""
# After these the context is unusable: every later call fails with them too ("sticky" errors).
_STICKY = frozenset(getattr(_E, f"CUDA_ERROR_{n}") for n in _STICKY_NAMES.split() if hasattr(_E, f"CUDA_ERROR_{n}"))
_INVALID_PARAM_INDEX = _E.CUDA_ERROR_INVALID_VALUE

_PACK = {None: "Q", ArgKind.F32: "f4x", ArgKind.I32: "i4x", ArgKind.U32: "I4x"}  # None: a tensor
_KIND_NAMES = {None: "a tensor", ArgKind.F32: "f32", ArgKind.I32: "i32", ArgKind.U32: "u32"}

_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_FLAG = re.compile(
    r"-D[A-Za-z_][A-Za-z0-9_]*(=[A-Za-z0-9_.]*)?|--?use_fast_math|--fmad=(true|false)|-lineinfo|--?std=c\+\+\d\d"
)
# Source checks. NVRTC reads `#include`d files from the daemon's filesystem and prints them in its
# log, so no spelling of an include may get through: trigraphs and raw strings (which the comment
# stripper below does not model) are refused outright, line splices are joined first, and comments
# are blanked by a scanner that consumes identifiers, numbers and literals whole, as the compiler does.
_FORBIDDEN = re.compile(
    r"\?\?[=/'()!<>-]|(?<![A-Za-z0-9_$])(?:u8|u|U|L)?R\"|__has_include|\\u00[0-7][0-9a-fA-F]|\\U000000[0-7][0-9a-fA-F]"
)
_SPLICE = re.compile(r"\\[ \t]*\r?\n")
_TOKENS = re.compile(
    r"/\*(?:.*?\*/|.*)|//[^\n]*"  # comments (an unclosed one runs to the end)
    r"|\"(?:\\.|[^\"\\\n])*\"?|'(?:\\.|[^'\\\n])*'?"  # string and character literals
    r"|\.?[0-9](?:[eEpP][+-]|'[0-9A-Za-z_]|[0-9A-Za-z_.])*|[A-Za-z_$][A-Za-z0-9_$]*",  # numbers, names
    re.S,
)
_DIRECTIVE = re.compile(r"(?:#|%:)\s*(?:include|include_next|import|embed)\b")


def _error(status: Any, what: str = "") -> GpudError:
    """The typed error for a failed CUresult or nvrtcResult."""
    if isinstance(status, nvrtc.nvrtcResult):
        cls: type[GpudError] = (
            InvalidArgument if status == nvrtc.nvrtcResult.NVRTC_ERROR_INVALID_OPTION else CompileError
        )
        text = nvrtc.nvrtcGetErrorString(status)[1]
    else:
        cls = DeviceLost if status in _STICKY else InvalidArgument
        if status == _E.CUDA_ERROR_OUT_OF_MEMORY:
            cls = OutOfMemory
        text = None
        with contextlib.suppress(Exception):  # no driver library
            text = cu.cuGetErrorString(status)[1]
    name = getattr(status, "name", str(status))
    message = f"{name}: {text.decode(errors='replace')}" if isinstance(text, bytes) else name
    return cls(f"{what}: {message}" if what else message)


def _check(result: tuple[Any, ...], what: str = "") -> Any:
    """Unwrap cuda-python's `(status, *values)`: the value (a tuple if several), or raise the typed error."""
    if result[0]:  # CUDA_SUCCESS and NVRTC_SUCCESS are both 0
        raise _error(result[0], what)
    return result[1] if len(result) == 2 else result[1:]


# ---------------------------------------------------------------------------- compiling


def check_source(source: str) -> str:
    """Refuse what could make NVRTC read host files; return the source with comments blanked."""
    joined = _SPLICE.sub("", source)
    for text in (source, joined):
        if match := _FORBIDDEN.search(text):
            found = match.group()
            if found.startswith("??"):
                raise InvalidArgument("trigraphs are not allowed in CUDA kernels")
            if found.endswith('"'):
                raise InvalidArgument("raw string literals are not allowed in CUDA kernels")
            if found.startswith("\\"):
                raise InvalidArgument("universal character names of ASCII characters are not allowed in CUDA kernels")
            raise InvalidArgument("includes are not allowed in CUDA kernels (__has_include)")
    stripped = _TOKENS.sub(lambda m: " " if m.group().startswith("/") else m.group(), joined)
    if _DIRECTIVE.search(stripped) or _DIRECTIVE.search(joined):
        raise InvalidArgument(
            "includes are not allowed in CUDA kernels: NVRTC would read them from the daemon's filesystem; "
            "paste what you need into the source"
        )
    return stripped


def check_flags(flags: Sequence[str]) -> list[bytes]:
    for flag in flags:
        if not _FLAG.fullmatch(flag):
            raise InvalidArgument(
                f"compiler flag {flag[:40]!r} is not allowed; allowed: -DNAME[=value], --use_fast_math, "
                "--fmad=true|false, -lineinfo, --std=c++NN"
            )
    return [flag.encode() for flag in flags]


def parse_parameters(stripped: str, entry: str) -> list[str] | None:
    """The entry's parameter declarations, from source with comments blanked; None if not found."""
    for match in re.finditer(rf"\b{entry}\s*\(([^()]*)\)", stripped):
        declaration = re.split(r"[;{}]", stripped[max(0, match.start() - 400) : match.start()])[-1]
        if "__global__" not in declaration:
            continue
        inner = match.group(1).strip()
        if "<" in inner:
            return None
        return [] if inner in ("", "void") else [p.strip() for p in inner.split(",")]
    return None


def written_tensors(parameters: Sequence[str]) -> frozenset[int]:
    """Positions, among pointer parameters, of those whose pointee is not const."""
    writes = set()
    pointers = [p.replace("[", "*") for p in parameters if "*" in p or "[" in p]
    for position, param in enumerate(pointers):
        if not re.search(r"\bconst\b", param[: param.rfind("*")]):
            writes.add(position)
    return frozenset(writes)


def target(major: int, minor: int) -> tuple[str, bool]:
    """(NVRTC architecture, whether it yields a CUBIN): the device's own if NVRTC knows it, else PTX."""
    capability = major * 10 + minor
    try:
        supported = _check(nvrtc.nvrtcGetSupportedArchs())
    except Exception:  # very old NVRTC
        return f"sm_{capability}", True
    if capability in supported:
        return f"sm_{capability}", True
    older = [arch for arch in supported if arch < capability]
    if not older:
        raise DeviceLost(f"NVRTC supports none of this device's architectures (sm_{capability})")
    return f"compute_{max(older)}", False  # PTX the driver compiles for the newer device


def compile_cuda(source: str, entry: str, arch: str, flags: Sequence[bytes], cubin: bool) -> bytes:
    """Compile with NVRTC: a CUBIN if `cubin` (falling back to PTX), else PTX; CompileError with the log."""
    program = _check(nvrtc.nvrtcCreateProgram(source.encode(), b"kernel.cu", 0, [], []))
    try:
        options = [f"--gpu-architecture={arch}".encode(), *flags]
        (status,) = nvrtc.nvrtcCompileProgram(program, len(options), options)
        if status:
            error = _error(status, "NVRTC")  # CompileError, or InvalidArgument for a bad option
            raise type(error)(_program_log(program) or str(error))
        if cubin:
            with contextlib.suppress(Exception):  # no CUBIN API or no CUBIN: PTX below
                image = bytearray(_check(nvrtc.nvrtcGetCUBINSize(program)))
                _check(nvrtc.nvrtcGetCUBIN(program, image))
                if image:
                    return bytes(image)
        image = bytearray(_check(nvrtc.nvrtcGetPTXSize(program)))
        _check(nvrtc.nvrtcGetPTX(program, image))
        return bytes(image)  # NUL-terminated, as cuModuleLoadData wants PTX
    finally:
        nvrtc.nvrtcDestroyProgram(program)


def _program_log(program: Any) -> str:
    text = bytearray(_check(nvrtc.nvrtcGetProgramLogSize(program)))
    _check(nvrtc.nvrtcGetProgramLog(program, text))
    return text.rstrip(b"\0").decode(errors="replace").strip()


def _parameter_sizes(function: Any, limit: int) -> tuple[int, ...] | None:
    """Each parameter's size from the driver (CUDA >= 12.4); None where it cannot tell."""
    sizes: list[int] = []
    try:
        for index in range(limit + 1):
            status, _offset, size = cu.cuFuncGetParamInfo(function, index)
            if status == _INVALID_PARAM_INDEX:
                return tuple(sizes)
            if status:
                return None
            sizes.append(size)
    except Exception:  # bindings or driver without cuFuncGetParamInfo
        return None
    return None  # more parameters than a dispatch may pass: let the count check say so


def _host_alloc(nbytes: int) -> int:
    return int(_check(cu.cuMemHostAlloc(nbytes, cu.CU_MEMHOSTALLOC_PORTABLE), "pinned staging"))


def _host_free(pointer: int) -> None:
    (status,) = cu.cuMemFreeHost(pointer)
    if status:
        log.debug("cuMemFreeHost: %s", _error(status))


def _address(data: memoryview) -> int:
    """Address of a contiguous buffer, read-only ones included."""
    return int(np.frombuffer(data, np.uint8).ctypes.data)


@dataclasses.dataclass(eq=False)
class _Launch:
    """What `Kernel.native` holds on CUDA."""

    module_id: int
    function: Any
    block: tuple[int, int, int]
    sizes: tuple[int, ...] | None  # parameter sizes from the driver; None: unknown
    nparams: int | None  # from the driver, else from the source; None: unknown
    formats: dict[tuple[Any, ...], str] = dataclasses.field(default_factory=dict)  # argument kinds -> struct format


# ---------------------------------------------------------------------------- the backend


class CudaBackend(Backend):
    name = "cuda"
    #: wait for completions with blocking synchronization (an interrupt) instead of a spinning thread
    blocking_sync: ClassVar[bool] = True

    def __init__(self, config: Config, on_fatal: Any) -> None:
        super().__init__(config, on_fatal)
        self._loop = asyncio.get_running_loop()
        try:
            _check(cu.cuInit(0))
            self._device = _check(cu.cuDeviceGet(config.device))
        except Exception as exc:  # no driver library at all raises its own exception type
            raise DeviceLost(f"no CUDA device {config.device}: {exc}") from None
        self._context = _check(cu.cuDevicePrimaryCtxRetain(self._device))
        _check(cu.cuCtxSetCurrent(self._context))
        capability = (self._attribute("COMPUTE_CAPABILITY_MAJOR"), self._attribute("COMPUTE_CAPABILITY_MINOR"))
        grid = [self._attribute(f"MAX_GRID_DIM_{d}") for d in "XYZ"]
        block = [self._attribute(f"MAX_BLOCK_DIM_{d}") for d in "XYZ"]
        self.max_grid = (grid[0], grid[1], grid[2])
        self._max_block = (block[0], block[1], block[2])
        self._arch, self._cubin = target(*capability)
        self._nvrtc_version = tuple(_check(nvrtc.nvrtcVersion()))
        name = _check(cu.cuDeviceGetName(256, self._device))
        self._info = {
            "backend": self.name,
            "name": name.split(b"\0", 1)[0].decode(errors="replace"),
            "vendor": "NVIDIA",
            "compute_capability": f"{capability[0]}.{capability[1]}",
            "memory_bytes": int(_check(cu.cuDeviceTotalMem(self._device))),
            "target": self._arch,
        }
        self._stream = _check(cu.cuStreamCreate(cu.CUstream_flags.CU_STREAM_NON_BLOCKING))
        self._event_flags = cu.CUevent_flags.CU_EVENT_DISABLE_TIMING | (
            cu.CUevent_flags.CU_EVENT_BLOCKING_SYNC if self.blocking_sync else 0
        )
        self._events: list[Any] = []
        self._modules: dict[int, Any] = {}
        self._dead_modules: list[int] = []  # of kernels nobody holds; unloaded after the next submit
        self._cache_dir = Path(config.cache_dir) / "cuda"
        # Launch parameters: one 8-byte slot per argument and a void* array pointing at the slots.
        # cuLaunchKernel copies the values, so one buffer serves every launch.
        slots = max(config.limits.max_args, 1)
        self._params = (ctypes.c_uint64 * slots)()
        first = ctypes.addressof(self._params)
        self._param_pointers = (ctypes.c_void_p * slots)(*(first + 8 * i for i in range(slots)))
        self._param_address = ctypes.addressof(self._param_pointers)
        half = config.staging_pool_bytes // 2
        self._uploads: StagingPool[int] = StagingPool(_host_alloc, _host_free, half, self.flush)
        self._downloads: StagingPool[int] = StagingPool(_host_alloc, _host_free, half, self.flush)
        self._completions: queue.SimpleQueue[tuple[Any, Done, list[int]] | None] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._wait_events, name="gpud-cuda-events", daemon=True)
        self._thread.start()
        self._closed = False
        self._spin_s = config.completion_spin_us / 1e6
        self._recorded: list[tuple[Any, ...]] = []
        self._graphs: LruCache[tuple[Any, ...], Any] = LruCache(max(1, config.graph_cache_size), self._drop_graph)
        self._seen: LruCache[tuple[Any, ...], int] = LruCache(max(1, 2 * config.graph_cache_size))
        self._download_pending = False

    def _attribute(self, name: str) -> int:
        attribute = getattr(cu.CUdevice_attribute, f"CU_DEVICE_ATTRIBUTE_{name}")
        return int(_check(cu.cuDeviceGetAttribute(attribute, self._device)))

    def device_info(self) -> dict[str, Any]:
        return dict(self._info)

    def stats(self) -> dict[str, Any]:
        stats = {
            **super().stats(),
            "upload_staging": self._uploads.stats(),
            "download_staging": self._downloads.stats(),
            "modules": len(self._modules),
            "graph_cache": self._graphs.stats(),
        }
        if self.fatal_error is None and not self._closed:
            free, total = _check(cu.cuMemGetInfo())
            stats["device_memory_free"], stats["device_memory_total"] = int(free), int(total)
        return stats

    # ------------------------------------------------------------------ errors

    def _call(self, result: tuple[Any, ...], what: str = "") -> Any:
        """`_check` for calls on the loop thread: a sticky error found here is fatal too."""
        try:
            return _check(result, what)
        except DeviceLost as exc:
            self._fail(exc)
            raise

    def _fail(self, error: DeviceLost) -> None:
        if self.fatal_error is None:
            self._complete(self._submitted + 1, error)  # fails every waiter and calls on_fatal

    # ------------------------------------------------------------------ kernels

    def _kernel_key(self, source: str, entry: str, options: KernelOptions) -> tuple[Any, ...]:
        return kernel_key(source, entry, options, self._arch, self._nvrtc_version)

    def _compile(self, key: tuple[Any, ...], source: str, entry: str, options: KernelOptions) -> Kernel:
        if options.block is None:
            raise InvalidArgument("CUDA kernels need options.block: threads per block, e.g. (256, 1, 1)")
        if not _IDENTIFIER.fullmatch(entry):
            raise InvalidArgument(f"entry point {entry[:40]!r} is not a C identifier")
        stripped = check_source(source)
        flags = check_flags(options.flags)
        parameters = parse_parameters(stripped, entry)
        module = self._load(key, source, entry, flags)
        try:
            launch = self._launch(module, entry, options.block, parameters)
        except BaseException:
            cu.cuModuleUnload(module)
            raise
        module_id = launch.module_id
        self._modules[module_id] = module
        if options.writes is not None:
            writes: frozenset[int] | None = frozenset(options.writes)
        else:
            writes = None if parameters is None else written_tensors(parameters)
        kernel = Kernel(key, entry, launch, options.block, writes)
        weakref.finalize(kernel, self._dead_modules.append, module_id).atexit = False  # the list is never replaced
        return kernel

    def _launch(self, module: Any, entry: str, block: tuple[int, int, int], parameters: list[str] | None) -> _Launch:
        status, function = cu.cuModuleGetFunction(module, entry.encode())
        if status:
            raise CompileError(
                f"no kernel named {entry!r} in the compiled module ({_error(status)}); declare it "
                f'extern "C" __global__ so that its name is not mangled'
            )
        threads = block[0] * block[1] * block[2]
        attribute = cu.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK
        most = int(_check(cu.cuFuncGetAttribute(attribute, function)))
        if threads > most or any(d > limit for d, limit in zip(block, self._max_block, strict=True)):
            raise InvalidArgument(
                f"block {tuple(block)} is too large for {entry}: at most {most} threads "
                f"and {self._max_block} per dimension"
            )
        sizes = _parameter_sizes(function, len(self._param_pointers))
        nparams = len(sizes) if sizes is not None else None if parameters is None else len(parameters)
        return _Launch(next(self._ids), function, block, sizes, nparams)

    def _load(self, key: tuple[Any, ...], source: str, entry: str, flags: list[bytes]) -> Any:
        """The loaded module: from the disk cache if it holds the image, else compiled and stored."""
        name = hashlib.sha256(repr(key).encode()).hexdigest() + (".cubin" if self._cubin else ".ptx")
        path = self._cache_dir / name
        with contextlib.suppress(OSError):
            image = path.read_bytes()
            status, module = cu.cuModuleLoadData(image)
            if not status:
                self.counters["disk_cache_hits"] += 1
                return module
            log.warning("dropping unloadable cached kernel %s: %s", path.name, _error(status))
            path.unlink(missing_ok=True)
        image = compile_cuda(source, entry, self._arch, flags, self._cubin)
        self.counters["nvrtc_compiles"] += 1
        self._store(path, image)
        return self._call(cu.cuModuleLoadData(image), "loading the compiled kernel")

    def _store(self, path: Path, image: bytes) -> None:
        try:
            path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
            fd, temporary = tempfile.mkstemp(dir=path.parent, prefix=".tmp-")
            try:
                with os.fdopen(fd, "wb") as f:
                    f.write(image)
                os.replace(temporary, path)
            except BaseException:
                os.unlink(temporary)
                raise
        except OSError as exc:
            log.warning("cannot write the kernel cache %s: %s", path.parent, exc)

    def _unload(self, module_id: int) -> None:
        if (module := self._modules.pop(module_id, None)) is not None:
            self._graphs.clear()  # rare; a graph must not outlive a kernel it launches
            self._seen.clear()
            (status,) = cu.cuModuleUnload(module)
            if status:
                log.debug("cuModuleUnload: %s", _error(status))

    # ------------------------------------------------------------------ memory and staging

    def _alloc(self, nbytes: int) -> Any:
        return int(self._call(cu.cuMemAlloc(max(nbytes, 4)), f"allocating {nbytes} bytes"))

    def _free(self, buffer_id: int, native: Any) -> None:
        # Called from completion callbacks: report, never raise.
        (status,) = cu.cuMemFree(native)
        if status and self.fatal_error is None:
            error = _error(status, "cuMemFree")
            log.error("%s", error)
            if isinstance(error, DeviceLost):
                self._loop.call_soon(self._fail, error)

    def _drop_caches(self) -> None:
        self._uploads.clear_idle()
        self._downloads.clear_idle()

    def _chunk_bytes(self) -> int:
        return min(16 << 20, self._uploads.largest_class())

    # ------------------------------------------------------------------ encoding

    def _prepare(self, kernel: Kernel, grid: tuple[int, int, int], args: Sequence[Arg]) -> tuple[Any, ...]:
        launch: _Launch = kernel.native
        kinds: list[Any] = []
        values: list[Any] = []
        for arg in args:
            if type(arg) is Buffer:
                kinds.append(None)
                values.append(arg.native)
            else:  # a scalar: (ArgKind, value)
                kinds.append(arg[0])  # type: ignore[index]
                values.append(arg[1])  # type: ignore[index]
        signature = tuple(kinds)
        fmt = launch.formats.get(signature) or self._format(kernel, signature)
        try:
            params = struct.pack(fmt, *values)
        except struct.error as exc:
            raise InvalidArgument(f"bad argument for {kernel.entry}: {exc}") from None
        return (launch.module_id, launch.function, *grid, *launch.block, params)

    def _encode_dispatch(self, prepared: Prepared) -> None:
        self._recorded.append(prepared.native)

    # A run of launches between copies is recorded, not launched, and issued as one segment when a
    # copy or a flush comes. A segment seen again with exactly the same launches (kernels, grids,
    # argument bytes) is captured into a CUDA graph once and replayed from then on: steps of a
    # decoder or a solver repeat, and a graph replay costs about a microsecond a kernel.

    def _issue_recorded(self) -> None:
        segment, self._recorded = self._recorded, []
        if not segment:
            return
        if len(segment) < self.config.graph_min_launches or self.config.graph_cache_size == 0:
            self._launch_all(segment)
            return
        key = tuple(segment)
        graph = self._graphs.get(key)
        if graph is None:
            seen = (self._seen.get(key) or 0) + 1
            if seen < 2:
                self._seen.put(key, seen)
                self._launch_all(segment)
                return
            self._seen.pop(key)
            graph = self._capture(segment)
            self._graphs.put(key, graph)
            self.counters["graphs_captured"] += 1
        else:
            self.counters["graph_replays"] += 1
        self._call(cu.cuGraphLaunch(graph, self._stream), "replaying a graph")

    def _launch_all(self, segment: list[tuple[Any, ...]]) -> None:
        params, address, stream = ctypes.addressof(self._params), self._param_address, self._stream
        for _module, function, gx, gy, gz, bx, by, bz, values in segment:
            ctypes.memmove(params, values, len(values))
            (status,) = cu.cuLaunchKernel(function, gx, gy, gz, bx, by, bz, 0, stream, address, 0)
            if status:
                self._call((status,), "launching a kernel")

    def _capture(self, segment: list[tuple[Any, ...]]) -> Any:
        mode = cu.CUstreamCaptureMode.CU_STREAM_CAPTURE_MODE_THREAD_LOCAL
        self._call(cu.cuStreamBeginCapture(self._stream, mode), "capturing a graph")
        try:
            self._launch_all(segment)
        finally:
            graph = self._call(cu.cuStreamEndCapture(self._stream), "capturing a graph")
        try:
            return self._call(cu.cuGraphInstantiate(graph, 0), "instantiating a graph")
        finally:
            cu.cuGraphDestroy(graph)

    def _drop_graph(self, _key: tuple[Any, ...], graph: Any) -> None:
        self.after_pending(lambda _err: cu.cuGraphExecDestroy(graph))  # it may still be running

    def _format(self, kernel: Kernel, signature: tuple[Any, ...]) -> str:
        """The struct format that packs arguments of these kinds, after checking them against the kernel."""
        launch: _Launch = kernel.native
        if launch.nparams is not None and len(signature) != launch.nparams:
            raise InvalidArgument(f"kernel {kernel.entry} takes {launch.nparams} arguments, {len(signature)} given")
        if len(signature) > len(self._param_pointers):
            raise InvalidArgument(f"at most {len(self._param_pointers)} arguments")
        for index, kind in enumerate(signature):
            if kind not in _PACK:
                raise InvalidArgument(f"argument {index} of {kernel.entry} has an unknown kind {kind!r}")
            want = 8 if kind is None else 4
            if launch.sizes is not None and launch.sizes[index] != want:
                raise InvalidArgument(
                    f"argument {index} of {kernel.entry} is {_KIND_NAMES[kind]} ({want} bytes) "
                    f"but the parameter takes {launch.sizes[index]} bytes"
                )
        if len(launch.formats) >= 64:
            launch.formats.clear()
        fmt = launch.formats[signature] = "<" + "".join(_PACK[kind] for kind in signature)
        return fmt

    def _encode_copy(self, src: Buffer, dst: Buffer, nbytes: int) -> None:
        self._issue_recorded()
        self._call(cu.cuMemcpyDtoDAsync(dst.native, src.native, nbytes, self._stream), "copy")

    async def _encode_upload(self, buffer: Buffer, offset: int, data: memoryview) -> None:
        nbytes = data.nbytes
        pinned, size = await self._uploads.acquire(nbytes)
        try:
            ctypes.memmove(pinned, _address(data), nbytes)
            self._issue_recorded()
            self._call(cu.cuMemcpyHtoDAsync(buffer.native + offset, pinned, nbytes, self._stream), "upload")
        except BaseException:
            self._uploads.give_back(pinned, size)
            raise
        self.after_pending(lambda _err: self._uploads.give_back(pinned, size))

    async def _encode_download(self, buffer: Buffer, offset: int, nbytes: int) -> asyncio.Future[bytes]:
        pinned, size = await self._downloads.acquire(nbytes)
        try:
            self._issue_recorded()
            self._call(cu.cuMemcpyDtoHAsync(pinned, buffer.native + offset, nbytes, self._stream), "download")
        except BaseException:
            self._downloads.give_back(pinned, size)
            raise
        future: asyncio.Future[bytes] = self._loop.create_future()
        self._download_pending = True

        def finished(error: BaseException | None) -> None:
            settle(future, ctypes.string_at(pinned, nbytes) if error is None else None, error)
            self._downloads.give_back(pinned, size)

        self.after_pending(finished)
        return future

    # ------------------------------------------------------------------ completion

    def _submit(self, done: Done) -> None:
        self._issue_recorded()
        # a failure here fails the whole submission in the base's flush
        event = self._events.pop() if self._events else _check(cu.cuEventCreate(self._event_flags))
        _check(cu.cuEventRecord(event, self._stream), "recording an event")
        count = len(self._dead_modules)  # finalizers may append meanwhile
        dead = self._dead_modules[:count]
        del self._dead_modules[:count]
        awaited, self._download_pending = self._download_pending, False
        if awaited and self._finished_within_spin(event):
            # Someone awaits this readback and the work was short: report it now, saving the two
            # thread hand-offs. A stream completes in order, so earlier submissions are done too.
            self._event_done((event, done, dead), None)
        else:
            self._completions.put((event, done, dead))

    def _finished_within_spin(self, event: Any) -> bool:
        deadline = time.perf_counter() + self._spin_s
        while True:
            (status,) = cu.cuEventQuery(event)
            if status == _E.CUDA_SUCCESS:
                return True
            if status != _E.CUDA_ERROR_NOT_READY or time.perf_counter() > deadline:
                return False  # errors are reported by the completion thread

    def _wait_events(self) -> None:
        """The completion thread: waits on each submit's event in order, reports on the loop thread."""
        cu.cuCtxSetCurrent(self._context)
        while (item := self._completions.get()) is not None:
            (status,) = cu.cuEventSynchronize(item[0])
            error = _error(status, "the GPU stream failed") if status else None
            try:
                self._loop.call_soon_threadsafe(self._event_done, item, error)
            except RuntimeError:  # the loop is closed: nobody waits any more
                return

    def _event_done(self, item: tuple[Any, Done, list[int]], error: GpudError | None) -> None:
        event, done, dead = item
        if error is None:
            self._events.append(event)
            for module_id in dead:
                self._unload(module_id)
        elif not isinstance(error, DeviceLost):
            error = DeviceLost(str(error))
        done(error)

    async def close(self) -> None:
        if self._closed:
            return
        try:
            await super().close()
        finally:
            self._release()

    def _release(self) -> None:
        self._closed = True
        self._drop_caches()
        self._completions.put(None)
        self._thread.join(timeout=10)
        for module_id in list(self._modules):
            self._unload(module_id)
        for event in self._events:
            cu.cuEventDestroy(event)
        self._events.clear()
        cu.cuStreamDestroy(self._stream)
        cu.cuDevicePrimaryCtxRelease(self._device)
