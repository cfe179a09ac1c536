#!/usr/bin/env python3
"""Compile every CUDA family of the op library (gpud/ops/*.cu) with NVRTC, as the daemon does, and
print what each entry point costs: registers, spills, local memory, shared memory, and the tensor-core
instructions in its SASS (HMMA: mma.sync; HGMMA: wgmma). No GPU is needed, only NVRTC (and cuobjdump
for the SASS counts):

    python3 -m venv /tmp/nvrtcenv
    /tmp/nvrtcenv/bin/pip install cuda-bindings nvidia-cuda-nvrtc nvidia-cuda-cuobjdump
    /tmp/nvrtcenv/bin/python scripts/check-cuda-compile.py            # every family, sm_90
    /tmp/nvrtcenv/bin/python scripts/check-cuda-compile.py matmul_tc attention --keep /tmp/cubins

A family is one NVRTC program (the daemon compiles the same source for each of its entry points, so
one build shows them all), for --arch (sm_90 by default; a source that uses wgmma is built for the
arch's "a" variant, sm_90a). Flags: `!hmma` on a kernel whose name says tensor cores (`_tc`, `flash`,
`_wg`, `_tma`) but whose SASS has no HMMA/HGMMA, `!local` on one that uses local memory (spills, or an array
indexed at run time), `!missing` on an entry point of gpud_protocol.ops (when importable) that neither
the build nor the family's WGSL source has. Exit status: 1 if a family fails to compile, or with
--strict if anything is flagged.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, NamedTuple

ROOT = Path(__file__).resolve().parent.parent
OPS = ROOT / "gpud" / "ops"
TENSOR_CORE_NAMES = re.compile(r"_tc\d|flash|_wg|_tma")
SPILLS = re.compile(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads")
COLUMNS = ("regs", "spill st/ld", "local", "smem", "HMMA", "HGMMA", "LDL/STL")
WIDTHS = (4, 11, 5, 6, 5, 5, 7)


class Usage(NamedTuple):
    regs: int = 0
    stack: int = 0
    local: int = 0
    shared: int = 0
    spill_stores: int = 0
    spill_loads: int = 0
    hmma: int = 0
    hgmma: int = 0
    ldl_stl: int = 0


def _preludes() -> tuple[dict[tuple[str, str], tuple[str, ...]], frozenset[str]]:
    """gpud/ops/preludes.py's table (standard library only: read without gpud's dependencies)."""
    spec = importlib.util.spec_from_file_location("gpud_ops_preludes", OPS / "preludes.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.TABLE, module.NAMES


PRELUDE_TABLE, PRELUDES = _preludes()  # gpud/ops/*.cu put before families, not families


def family_source(family: str) -> str:
    """The family's source as the daemon compiles it (gpud.ops.source, with its preludes) where gpud
    imports, else the .cu file as it is."""
    for path in (ROOT / "protocol", ROOT):
        if str(path) not in sys.path:
            sys.path.insert(0, str(path))
    try:
        from gpud.ops import source

        text: str = source(family, "cuda")
        return text
    except ImportError:  # without gpud's dependencies: the family's preludes first, as gpud.ops.source puts them
        text = (OPS / f"{family}.cu").read_text()
        preludes = PRELUDE_TABLE.get((family, "cuda"), ())
        return "".join((OPS / f"{name}.cu").read_text() for name in preludes) + text


def expected_entries(family: str) -> set[str] | None:
    """The entry points gpud_protocol.ops names in `family`, or None where it does not import."""
    try:
        from gpud_protocol.ops import KERNELS
    except ImportError:
        return None
    return {spec.name for spec in KERNELS.values() if spec.family == family}


def compile_family(source: str, arch: str) -> tuple[bytes, str, float]:
    """(CUBIN, NVRTC's log with ptxas's report, seconds); RuntimeError with the log on failure."""
    from cuda.bindings import nvrtc

    def check(result: Any) -> Any:
        status, *rest = result if isinstance(result, tuple) else (result,)
        if status != nvrtc.nvrtcResult.NVRTC_SUCCESS:
            raise RuntimeError(f"NVRTC: {status}")
        return rest[0] if len(rest) == 1 else rest

    program = check(nvrtc.nvrtcCreateProgram(source.encode(), b"kernel.cu", 0, [], []))
    try:
        options = [f"--gpu-architecture={arch}".encode(), b"--ptxas-options=-v"]
        started = time.perf_counter()
        (status,) = nvrtc.nvrtcCompileProgram(program, len(options), options)
        seconds = time.perf_counter() - started
        log = bytearray(check(nvrtc.nvrtcGetProgramLogSize(program)))
        check(nvrtc.nvrtcGetProgramLog(program, log))
        text = log.rstrip(b"\0").decode(errors="replace")
        if status != nvrtc.nvrtcResult.NVRTC_SUCCESS:
            raise RuntimeError(text or str(status))
        image = bytearray(check(nvrtc.nvrtcGetCUBINSize(program)))
        check(nvrtc.nvrtcGetCUBIN(program, image))
        return bytes(image), text, seconds
    finally:
        nvrtc.nvrtcDestroyProgram(program)


def ptxas_spills(log: str) -> dict[str, tuple[int, int, int, int]]:
    """Per function, from ptxas -v: (registers, stack frame, spill stores, spill loads) in bytes."""
    found: dict[str, list[int]] = {}
    current = None
    for line in log.splitlines():
        if m := re.search(r"Function properties for (\S+)", line):
            current = m.group(1)
            found.setdefault(current, [0, 0, 0, 0])
        elif current and (m := SPILLS.search(line)):
            found[current][1:] = [int(g) for g in m.groups()]
        elif m := re.search(r"Compiling entry function '(\S+)'", line):
            current = m.group(1)
            found.setdefault(current, [0, 0, 0, 0])
        elif current and (m := re.search(r"Used (\d+) registers", line)):
            found[current][0] = int(m.group(1))
    return {name: (v[0], v[1], v[2], v[3]) for name, v in found.items()}


def find_cuobjdump() -> str | None:
    if (env := os.environ.get("CUOBJDUMP")) and Path(env).is_file():
        return env
    if on_path := shutil.which("cuobjdump"):
        return on_path
    try:
        import nvidia

        for base in nvidia.__path__:
            for candidate in sorted(Path(base).glob("cu*/bin/cuobjdump")):
                return str(candidate)
    except ImportError:
        pass
    return None


def sass_usage(tool: str, cubin: Path) -> dict[str, Usage]:
    """Per function: resources (cuobjdump -res-usage) and instruction counts of its SASS."""
    usage: dict[str, dict[str, int]] = {}
    text = subprocess.run([tool, "-res-usage", str(cubin)], capture_output=True, text=True, check=True).stdout
    current = None
    for line in text.splitlines():
        if m := re.match(r"\s*Function (\S+):", line):
            current = m.group(1)
            usage[current] = {}
        elif current and "REG:" in line:
            for key, value in re.findall(r"(REG|STACK|SHARED|LOCAL):(\d+)", line):
                usage[current][key] = int(value)
    sass = subprocess.run([tool, "-sass", str(cubin)], capture_output=True, text=True, check=True).stdout
    counts: dict[str, dict[str, int]] = {}
    current = None
    for line in sass.splitlines():
        if m := re.match(r"\s*Function : (\S+)", line):
            current = m.group(1)
            counts[current] = {"HMMA": 0, "HGMMA": 0, "LDLSTL": 0}
        elif current:
            op = re.search(r"/\*[0-9a-f]{4,}\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_]*)", line)
            if op:
                name = op.group(1)
                if name == "HMMA":
                    counts[current]["HMMA"] += 1
                elif name == "HGMMA":
                    counts[current]["HGMMA"] += 1
                elif name in ("LDL", "STL"):
                    counts[current]["LDLSTL"] += 1
    result = {}
    for name in sorted(set(usage) | set(counts)):
        u, c = usage.get(name, {}), counts.get(name, {})
        result[name] = Usage(
            regs=u.get("REG", 0),
            stack=u.get("STACK", 0),
            local=u.get("LOCAL", 0),
            shared=u.get("SHARED", 0),
            hmma=c.get("HMMA", 0),
            hgmma=c.get("HGMMA", 0),
            ldl_stl=c.get("LDLSTL", 0),
        )
    return result


def check_family(family: str, arch: str, tool: str | None, keep: Path | None) -> tuple[bool, int]:
    """Build and report one family: (compiled, flags raised)."""
    source = family_source(family)
    target = arch + "a" if "wgmma" in source and not arch.endswith("a") else arch
    try:
        image, log, seconds = compile_family(source, target)
    except RuntimeError as exc:
        print(f"== {family} ({target}): COMPILE FAILED\n{exc}")
        return False, 1
    spills = ptxas_spills(log)
    directory = keep or Path(tempfile.mkdtemp(prefix="gpud-cubin-"))
    directory.mkdir(parents=True, exist_ok=True)
    cubin = directory / f"{family}.{target}.cubin"
    cubin.write_bytes(image)
    sass = sass_usage(tool, cubin) if tool else {}
    names = sorted(set(spills) | set(sass))
    print(f"== {family} ({target}): {len(names)} entry points, {seconds:.1f} s, {len(image) >> 10} KiB cubin")
    print(f"   {'entry':<40} " + " ".join(f"{c:>{w}}" for c, w in zip(COLUMNS, WIDTHS, strict=True)))
    flags = 0
    for name in names:
        regs, stack, stores, loads = spills.get(name, (0, 0, 0, 0))
        u = sass.get(name, Usage())
        notes = []
        tensor_cores = u.hmma + u.hgmma
        if tool and TENSOR_CORE_NAMES.search(name) and tensor_cores == 0:
            notes.append("!hmma")
        if stores or loads or u.local or u.ldl_stl or stack:
            notes.append("!local")
        flags += len(notes)
        sass_counts = (u.hmma, u.hgmma, u.ldl_stl) if tool else ("-", "-", "-")
        values = (max(regs, u.regs), f"{stores}/{loads}", max(u.local, stack), u.shared, *sass_counts)
        cells = " ".join(f"{v:>{w}}" for v, w in zip(values, WIDTHS, strict=True))
        print(f"   {name:<40} {cells} {' '.join(notes)}")
    wanted = expected_entries(family)
    if wanted is not None and (absent := wanted - set(names)):
        wgsl = OPS / f"{family}.wgsl"
        webgpu_only = {n for n in absent if wgsl.is_file() and re.search(rf"\bfn {n}\(", wgsl.read_text())}
        if webgpu_only:
            print(f"   ({len(webgpu_only)} entry points of gpud_protocol.ops are WebGPU's only)")
        if missing := sorted(absent - webgpu_only):
            print(f"   !missing: {missing}")
            flags += len(missing)
    if keep is None:
        shutil.rmtree(directory, ignore_errors=True)
    return True, flags


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("families", nargs="*", help="families to build (default: every gpud/ops/*.cu)")
    parser.add_argument("--arch", default="sm_90", help="NVRTC's --gpu-architecture (default sm_90)")
    parser.add_argument("--keep", type=Path, help="write the CUBINs here")
    parser.add_argument("--strict", action="store_true", help="exit 1 if anything is flagged")
    args = parser.parse_args()
    families = args.families or sorted(p.stem for p in OPS.glob("*.cu") if p.stem not in PRELUDES)
    tool = find_cuobjdump()
    if tool is None:
        print("cuobjdump not found (set CUOBJDUMP, or pip install nvidia-cuda-cuobjdump): no SASS counts")
    failed, flags = False, 0
    for family in families:
        ok, raised = check_family(family, args.arch, tool, args.keep)
        failed |= not ok
        flags += raised
    print(f"{len(families)} families, {'a compile FAILED' if failed else 'all compiled'}, {flags} flags")
    return 1 if failed or (args.strict and flags) else 0


if __name__ == "__main__":
    sys.exit(main())
