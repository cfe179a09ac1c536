"""CUDA C to a loaded module: source and flag checks, the kernel's interface read from its parameter
list, NVRTC, and the disk cache of compiled images.

Kernel convention: an `extern "C" __global__` entry point; tensor arguments are device pointers and
scalars are 4-byte f32/i32/u32 values, in the order of its parameter list; `options.block` (threads
per block) is required. The checks and the parameter reading are pure Python (no cuda-python):
the functions that need NVRTC or the driver import it when called.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import re
import tempfile
import threading
from collections.abc import Iterator, MutableMapping, Sequence
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

from gpud_protocol.errors import DeviceLost, InvalidArgument

log = logging.getLogger(__name__)

IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
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

# Scalar parameter types gpud can pass, after dropping qualifiers (`const float a` is f32).
_SCALAR_TYPES = {
    "float": "f32",
    "int": "i32",
    "int32_t": "i32",
    "signed": "i32",
    "signed int": "i32",
    "unsigned": "u32",
    "unsigned int": "u32",
    "uint32_t": "u32",
}
_QUALIFIERS = frozenset({"const", "volatile", "__restrict__", "__restrict"})
_TYPE_WORDS = frozenset({"float", "double", "int", "signed", "unsigned", "long", "short", "char", "bool", "void"})
_WORDS = re.compile(r"[A-Za-z_$][A-Za-z0-9_$]*|\S")
_TENSOR_MAP = re.compile(r"\bTmaMap\b")


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


def _is_pointer(parameter: str) -> bool:
    """A tensor's parameter: a pointer, or a tensor map (the library's TMA kernels take x and w as
    `const __grid_constant__ TmaMap`, encoded by the daemon from the pointer: gpud.backends.cuda.tma)."""
    return "*" in parameter or "[" in parameter or _TENSOR_MAP.search(parameter) is not None


def written_tensors(parameters: Sequence[str]) -> frozenset[int]:
    """Positions, among pointer parameters, of those whose pointee is not const (a tensor map is read)."""
    writes = set()
    pointers = [p.replace("[", "*") for p in parameters if _is_pointer(p)]
    for position, param in enumerate(pointers):
        if "*" in param and not re.search(r"\bconst\b", param[: param.rfind("*")]):
            writes.add(position)
    return frozenset(writes)


def scalar_kinds(parameters: Sequence[str]) -> tuple[str, ...] | None:
    """The kinds ("f32", "i32", "u32") of the non-pointer parameters, in order; None if any has
    another type (double, half, long, a struct, a reference...)."""
    kinds: list[str] = []
    for parameter in parameters:
        if _is_pointer(parameter):
            continue
        words = [w for w in _WORDS.findall(parameter.split("=", 1)[0]) if w not in _QUALIFIERS]
        kind = _SCALAR_TYPES.get(" ".join(words))  # an unnamed parameter
        if kind is None and len(words) >= 2 and IDENTIFIER.fullmatch(words[-1]) and words[-1] not in _TYPE_WORDS:
            kind = _SCALAR_TYPES.get(" ".join(words[:-1]))
        if kind is None:
            return None
        kinds.append(kind)
    return tuple(kinds)


def interface(
    parameters: Sequence[str] | None, declared_writes: Sequence[int] | None, sizes_known: bool
) -> tuple[int | None, tuple[str, ...] | None, frozenset[int] | None, tuple[str, ...]]:
    """(tensor count, scalar kinds, written tensors, what could not be checked) for `Program`."""
    unchecked: list[str] = []
    tensors: int | None = None
    scalars: tuple[str, ...] | None = None
    if parameters is None:
        unchecked.append("the parameter list (templates or macros): tensor and scalar kinds are not checked")
    else:
        tensors = sum(map(_is_pointer, parameters))
        scalars = scalar_kinds(parameters)
        if scalars is None:
            unchecked.append("scalar parameters other than float, int and unsigned: scalar kinds are not checked")
    if not sizes_known:
        unchecked.append("argument sizes: this driver cannot report them (cuFuncGetParamInfo needs CUDA 12.4)")
    if declared_writes is not None:
        writes: frozenset[int] | None = frozenset(declared_writes)
    else:
        writes = None if parameters is None else written_tensors(parameters)
    if tensors != 0 and writes is None:
        unchecked.append("which tensors it writes: every tensor argument counts as written")
    elif tensors != 0:
        unchecked.append("CUDA C can cast const away: read-only guards against mistakes only")
    return tensors, scalars, writes, tuple(unchecked)


# ---------------------------------------------------------------------------- NVRTC and the disk cache


def target(major: int, minor: int) -> tuple[str, bool]:
    """(NVRTC architecture, whether it yields a CUBIN): the device's own if NVRTC knows it, else PTX.
    Hopper (9.0) gets its arch-specific target sm_90a, which adds wgmma (the matmul_wg kernels); a
    CUBIN for it runs on exactly this architecture, as every CUBIN here does."""
    from gpud.backends.cuda.driver import check, nvrtc

    capability = major * 10 + minor
    try:
        supported = check(nvrtc.nvrtcGetSupportedArchs())
    except Exception:  # very old NVRTC
        return f"sm_{capability}", True
    if capability in supported:
        return (f"sm_{capability}a" if capability == 90 else f"sm_{capability}"), True
    older = [arch for arch in supported if arch < capability]
    if not older:
        raise DeviceLost(f"NVRTC supports none of this device's architectures (sm_{capability})")
    return f"compute_{max(older)}", False  # PTX the driver compiles for the newer device


def compile_cuda(source: str, entry: str, arch: str, flags: Sequence[bytes], cubin: bool) -> bytes:
    """Compile with NVRTC: a CUBIN if `cubin` (falling back to PTX), else PTX; CompileError with the log."""
    from gpud.backends.cuda.driver import check, error, nvrtc

    program = check(nvrtc.nvrtcCreateProgram(source.encode(), b"kernel.cu", 0, [], []))
    try:
        options = [f"--gpu-architecture={arch}".encode(), *flags]
        (status,) = nvrtc.nvrtcCompileProgram(program, len(options), options)
        if status:
            failure = error(status, "NVRTC")  # CompileError, or InvalidArgument for a bad option
            raise type(failure)(_program_log(program) or str(failure))
        if cubin:
            with contextlib.suppress(Exception):  # no CUBIN API or no CUBIN: PTX below
                image = bytearray(check(nvrtc.nvrtcGetCUBINSize(program)))
                check(nvrtc.nvrtcGetCUBIN(program, image))
                if image:
                    return bytes(image)
        image = bytearray(check(nvrtc.nvrtcGetPTXSize(program)))
        check(nvrtc.nvrtcGetPTX(program, image))
        return bytes(image)  # NUL-terminated, as cuModuleLoadData wants PTX
    finally:
        nvrtc.nvrtcDestroyProgram(program)


def _program_log(program: Any) -> str:
    from gpud.backends.cuda.driver import check, nvrtc

    text = bytearray(check(nvrtc.nvrtcGetProgramLogSize(program)))
    check(nvrtc.nvrtcGetProgramLog(program, text))
    return text.rstrip(b"\0").decode(errors="replace").strip()


def load_module(
    cache_dir: Path,
    key: tuple[Any, ...],
    source: str,
    entry: str,
    flags: Sequence[bytes],
    arch: str,
    cubin: bool,
    counters: MutableMapping[str, int],
    counting: AbstractContextManager[Any],
) -> Any:
    """The module loaded in the current context: from the disk cache (named by a hash of the exact
    image key: source digest, flags, architecture, NVRTC) if it holds the image, else compiled and
    stored. Counts `disk_cache_hits` and `nvrtc_compiles` in `counters`, holding `counting` (compiles
    run on several threads)."""
    from gpud.backends.cuda.driver import check, cu, error

    path = cache_dir / (hashlib.sha256(repr(key).encode()).hexdigest() + (".cubin" if cubin else ".ptx"))
    with contextlib.suppress(OSError):
        image = path.read_bytes()
        status, module = cu.cuModuleLoadData(image)
        if not status:
            with counting:
                counters["disk_cache_hits"] += 1
            return module
        log.warning("dropping unloadable cached kernel %s: %s", path.name, error(status))
        path.unlink(missing_ok=True)
    image = compile_cuda(source, entry, arch, flags, cubin)
    with counting:
        counters["nvrtc_compiles"] += 1
    _store(path, image)
    return check(cu.cuModuleLoadData(image), "loading the compiled kernel")


class OneBuild:
    """Compiles of one image, one at a time: where several threads ask for entries of one family at once,
    the first compiles (and stores the image in the disk cache), the others wait and then load it. Holds
    only the images being built."""

    def __init__(self) -> None:
        self.lock = threading.Lock()  # guards `_building`, and the counters of load_module
        self._building: dict[tuple[Any, ...], threading.Event] = {}

    @contextlib.contextmanager
    def of(self, key: tuple[Any, ...]) -> Iterator[None]:
        with self.lock:
            built = self._building.get(key)
            if built is None:
                self._building[key] = threading.Event()
        if built is not None:
            built.wait()
            yield
            return
        try:
            yield
        finally:
            with self.lock:
                self._building.pop(key).set()


def _store(path: Path, image: bytes) -> None:
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
