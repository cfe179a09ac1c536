"""The flash attention kernels of gpud/ops/attention.cu, without the daemon: checked against numpy
(float64) and timed beside PyTorch's `F.scaled_dot_product_attention`, in one process.

    PYTHONPATH=$PWD/protocol:$PWD python3 benchmarks/attention_harness.py [--quick] [--json FILE]

The source is compiled by NVRTC (cuda-python) for the device, as gpud's CUDA backend does, and its
kernels are launched with cuLaunchKernel on PyTorch's stream, over PyTorch's tensors: q (B, T, Hq, D)
and k, v (B, S, Hkv, D) float16, the op library's layout. The only gpud module imported is
gpud_protocol.ops.attention_flash, for its grid and its rule (each launch is checked against the spec).

Checks: key masks of every dtype, fully masked rows, causal (T = S and T != S), grouped heads, head
sizes 32/64/128, odd lengths and S = 1; outputs poisoned with NaN first. Timing: each way captured
into a CUDA graph of several calls rotating over input sets that together pass the L2 cache, the
median replay over calls. torch gets the same tensors as (B, H, S, D) views (transpose(1, 2)), the
padding mask as a boolean attn_mask (B, 1, 1, S), GQA through enable_gqa.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import math
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
# run as a script, this folder comes first on sys.path, and its cuda.py would hide cuda-python's `cuda`
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent]
SOURCE = ROOT / "gpud" / "ops" / "attention.cu"
TOL = 2e-3  # of max(1, |ref|): P is rounded to float16 (2^-11), and a float16 output once more
ENCODER = [(256, 62), (64, 128), (16, 512)]  # (B, S): 12 heads x 32, a padding mask
DECODER = [(1, 1024), (1, 4096), (4, 1024)]  # (B, S): causal, 14 q heads / 2 kv heads x 64
MASK_DTYPES: dict[str, Any] = {"uint8": np.uint8, "int32": np.int32, "float32": np.float32, "int64": np.int64}


def _ok(result: Any) -> Any:
    err, *rest = result if isinstance(result, tuple) else (result,)
    if int(err) != 0:
        raise RuntimeError(f"CUDA error {err!r}")
    return rest[0] if len(rest) == 1 else (rest or None)


class Kernels:
    """attention.cu compiled by NVRTC for the current device; launches on torch's current stream."""

    def __init__(self, torch: Any) -> None:
        from cuda.bindings import driver as cu
        from cuda.bindings import nvrtc

        self.cu, self.torch = cu, torch
        torch.cuda.init()
        torch.zeros(1, device="cuda")  # the primary context, current on this thread
        _ok(cu.cuInit(0))
        major, minor = torch.cuda.get_device_capability()
        program = _ok(nvrtc.nvrtcCreateProgram(SOURCE.read_bytes(), b"attention.cu", 0, [], []))
        options = [f"--gpu-architecture=sm_{major}{minor}".encode()]
        start = time.perf_counter()
        (status,) = nvrtc.nvrtcCompileProgram(program, len(options), options)
        self.compile_s = time.perf_counter() - start
        log = bytearray(_ok(nvrtc.nvrtcGetProgramLogSize(program)))
        nvrtc.nvrtcGetProgramLog(program, log)
        if int(status) != 0:
            raise RuntimeError(f"NVRTC failed:\n{log.decode(errors='replace')}")
        cubin = bytearray(_ok(nvrtc.nvrtcGetCUBINSize(program)))
        _ok(nvrtc.nvrtcGetCUBIN(program, cubin))
        self.module = _ok(cu.cuModuleLoadData(bytes(cubin)))
        self.functions: dict[str, Any] = {}
        self.keep: list[Any] = []
        try:
            from gpud_protocol.ops import KERNELS
            from gpud_protocol.ops.attention_flash import FLASH_BLOCK
            from gpud_protocol.ops.attention_flash import flash_grid as grid

            assert FLASH_BLOCK == 128 and grid(3, 65, 5) == flash_grid(3, 65, 5)
            self.specs: dict[str, Any] | None = KERNELS
        except Exception as exc:  # another engineer's half-done edit: run without the rule
            print(f"spec checks skipped: {exc!r}")
            self.specs = None

    def has(self, name: str) -> bool:
        return int(self.cu.cuModuleGetFunction(self.module, name.encode())[0]) == 0

    def function(self, name: str) -> Any:
        if name not in self.functions:
            self.functions[name] = _ok(self.cu.cuModuleGetFunction(self.module, name.encode()))
        return self.functions[name]

    def attributes(self, name: str) -> dict[str, int]:
        attr = self.cu.CUfunction_attribute
        f = self.function(name)
        return {
            "registers": int(_ok(self.cu.cuFuncGetAttribute(attr.CU_FUNC_ATTRIBUTE_NUM_REGS, f))),
            "shared_bytes": int(_ok(self.cu.cuFuncGetAttribute(attr.CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES, f))),
            "local_bytes": int(_ok(self.cu.cuFuncGetAttribute(attr.CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES, f))),
        }

    def launch(self, name: str, grid: tuple[int, int, int], block: int, tensors: list[Any], scalars: list[Any]) -> None:
        """tensors: torch tensors; scalars: (value, "u32" | "f32")."""
        if self.specs is not None:
            from gpud_protocol.ops import TensorInfo

            infos = [TensorInfo(str(t.dtype).replace("torch.", ""), tuple(t.shape)) for t in tensors]
            self.specs[name].check(infos, [v for v, _ in scalars])
        slots: list[Any] = [ctypes.c_uint64(t.data_ptr()) for t in tensors]
        slots += [ctypes.c_uint32(v) if kind == "u32" else ctypes.c_float(v) for v, kind in scalars]
        params = (ctypes.c_void_p * len(slots))(*(ctypes.addressof(s) for s in slots))
        stream = self.cu.CUstream(self.torch.cuda.current_stream().cuda_stream)
        _ok(self.cu.cuLaunchKernel(self.function(name), *grid, block, 1, 1, 0, stream, ctypes.addressof(params), 0))


def flash_grid(batch: int, steps: int, heads: int) -> tuple[int, int, int]:
    """gpud_protocol.ops.attention_flash.flash_grid, here too in case the protocol cannot be imported."""
    return (-(-steps // 64), heads, batch)


def flash(kern: Kernels, q: Any, k: Any, v: Any, out: Any, causal: bool, key_mask: Any, mode: int) -> None:
    b, t, hq, d = q.shape
    s, hkv = k.shape[1], k.shape[2]
    name = f"attention_flash_d{d}_{'f16' if out.dtype == kern.torch.float16 else 'f32'}"
    scalars = [(b, "u32"), (t, "u32"), (s, "u32"), (hq, "u32"), (hkv, "u32"), (d, "u32"), (int(causal), "u32")]
    scalars += [(mode, "u32"), (1.0 / math.sqrt(d), "f32")]
    mask = q if key_mask is None else key_mask
    kern.launch(name, flash_grid(b, t, hq), 128, [q, k, v, mask, out], scalars)


def two_pass(
    kern: Kernels, q: Any, k: Any, v: Any, out: Any, part: Any, causal: bool, key_mask: Any, mode: int
) -> None:
    """Today's kernels (attention_f16_f16 then attention_combine_f32), float32 out, as the client runs them."""
    b, t, hq, d = q.shape
    s, hkv = k.shape[1], k.shape[2]
    splits = part.shape[-2]
    sizes = [b, t, s, hq, hkv, d, splits, int(causal), mode, 0]
    mask = q if key_mask is None else key_mask
    scalars = [(n, "u32") for n in sizes] + [(1.0 / math.sqrt(d), "f32")]
    kern.launch("attention_f16_f16", grid_1d(b * t * hq * splits, 1), 256, [q, k, v, q, mask, part], scalars)
    n = out.numel()
    kern.launch("attention_combine_f32", grid_1d(n, 256), 256, [part, out], [(n, "u32"), (d, "u32"), (splits, "u32")])


def grid_1d(threads: int, block: int) -> tuple[int, int, int]:
    groups = max(1, -(-threads // block))
    return (groups, 1, 1) if groups <= 65535 else (65535, -(-groups // 65535), 1)


def reference(q: np.ndarray, k: np.ndarray, v: np.ndarray, causal: bool, keep: np.ndarray | None) -> np.ndarray:
    """float64; keep (B, S) bool; a row that sees no key gives zeros."""
    q64, k64, v64 = (a.astype(np.float64) for a in (q, k, v))
    rep = q.shape[2] // k.shape[2]
    k64, v64 = np.repeat(k64, rep, axis=2), np.repeat(v64, rep, axis=2)
    t, s = q.shape[1], k.shape[1]
    scores = np.einsum("bthd,bshd->bhts", q64, k64) / math.sqrt(q.shape[-1])
    seen = np.ones((q.shape[0], 1, t, s), bool)
    if causal:
        seen &= (np.arange(s)[None, :] <= np.arange(t)[:, None] + (s - t))[None, None]
    if keep is not None:
        seen &= keep[:, None, None, :]
    scores = np.where(seen, scores, -np.inf)
    top = scores.max(axis=-1, keepdims=True)
    w = np.where(seen, np.exp(scores - np.where(np.isfinite(top), top, 0.0)), 0.0)
    total = w.sum(axis=-1, keepdims=True)
    out: np.ndarray = np.einsum("bhts,bshd->bthd", w / np.where(total > 0, total, 1.0), v64)
    return out


def check_cases(kern: Kernels, rng: np.random.Generator) -> list[dict[str, Any]]:
    torch = kern.torch
    cases: list[tuple[str, int, int, int, int, int, int, bool, str | None]] = [
        # name, B, T, S, Hq, Hkv, D, causal, key mask dtype
        ("padding d32", 5, 62, 62, 12, 12, 32, False, "int32"),
        ("padding d64 uint8", 3, 77, 77, 4, 4, 64, False, "uint8"),
        ("padding d128 float32", 2, 130, 130, 2, 2, 128, False, "float32"),
        ("padding int64 causal", 3, 100, 100, 4, 2, 64, True, "int64"),
        ("causal gqa d64", 2, 257, 257, 14, 2, 64, True, None),
        ("causal gqa d128 T<S", 2, 37, 300, 8, 2, 128, True, None),
        ("causal T>S", 1, 90, 70, 2, 1, 32, True, None),
        ("odd S d32", 3, 1, 333, 3, 1, 32, False, None),
        ("S=1", 4, 1, 1, 2, 2, 64, False, None),
        ("S=1 T=5 causal", 2, 5, 1, 2, 1, 32, True, "int32"),
        ("long masked d64", 1, 65, 1500, 4, 4, 64, False, "uint8"),
        ("long causal d32", 1, 700, 700, 2, 2, 32, True, None),
    ]
    results = []
    for name, b, t, s, hq, hkv, d, causal, mdtype in cases:
        q = rng.standard_normal((b, t, hq, d)).astype(np.float16)
        k = (rng.standard_normal((b, s, hkv, d)) * 1.5).astype(np.float16)
        v = rng.standard_normal((b, s, hkv, d)).astype(np.float16)
        keep = None
        if mdtype is not None:
            lengths = rng.integers(1, s + 1, b)
            keep = np.arange(s)[None, :] < lengths[:, None]
            if b > 1:
                keep[0] = False  # batch row 0 sees nothing: zeros
            if b > 2:
                keep[2] = rng.random(s) < 0.5  # holes, not only a tail
            k[~keep] = np.nan  # hidden keys are never read
            v[~keep] = np.nan
        ref = reference(q, np.nan_to_num(k), np.nan_to_num(v), causal, keep)
        qt, kt, vt = (torch.from_numpy(a).cuda() for a in (q, k, v))
        mask, mode = None, 0
        if keep is not None and mdtype is not None:
            mask = torch.from_numpy(keep.astype(MASK_DTYPES[mdtype])).cuda()
            mode = {"uint8": 3, "int32": 4, "float32": 5, "int64": 6}[mdtype]
        errors: dict[str, float] = {}
        zeros = True
        for way in (*(["flash f16"] if kern.has("attention_flash_d32_f16") else []), "flash f32", "two-pass"):
            out_dtype = torch.float16 if way == "flash f16" else torch.float32
            out = torch.full(qt.shape, float("nan"), dtype=out_dtype, device="cuda")
            if way == "two-pass":  # today's kernel, with the key mask too
                part = torch.empty(*qt.shape[:-1], 2, d + 2, device="cuda", dtype=torch.float32)
                two_pass(kern, qt, kt, vt, out, part, causal, mask, mode)
            else:
                flash(kern, qt, kt, vt, out, causal, mask, mode)
            torch.cuda.synchronize()
            got = out.double().cpu().numpy()
            nan = bool(np.isnan(got).any())
            errors[way] = math.inf if nan else float(np.max(np.abs(got - ref) / np.maximum(1.0, np.abs(ref))))
            if keep is not None and not keep[0].any():
                zeros = zeros and bool(np.all(got[0] == 0))
        ok = zeros and errors["flash f32"] <= TOL and errors.get("flash f16", 0.0) <= TOL and errors["two-pass"] <= 1e-4
        shape = [b, t, s, hq, hkv, d]
        results.append({"case": name, "shape": shape, "causal": causal, "mask": mdtype, "errors": errors, "ok": ok})
        text = ", ".join(f"{w} {e:.1e}" for w, e in errors.items())
        print(f"  {'ok ' if ok else 'BAD'} {name:<24} B={b} T={t} S={s} Hq={hq} Hkv={hkv} D={d}: {text}")
    return results


def timed(torch: Any, calls: list[Any], reps: int) -> float:
    """Median microseconds per call of `calls` (closures launching on the current stream), replayed as one graph."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for call in calls[:2]:
            call()
    torch.cuda.current_stream().wait_stream(stream)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for call in calls:
            call()
    graph.replay()
    torch.cuda.synchronize()
    samples = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        samples.append(start.elapsed_time(end) * 1e3 / len(calls))
    del graph
    return float(statistics.median(samples))


def bench_shape(kern: Kernels, rng: np.random.Generator, kind: str, b: int, s: int, reps: int) -> dict[str, Any]:
    torch = kern.torch
    functional = torch.nn.functional
    hq, hkv, d, causal = (12, 12, 32, False) if kind == "encoder" else (14, 2, 64, True)
    one = b * s * (hq + 2 * hkv + hq) * d * 2  # q, k, v and a float16 out
    sets = max(2, min(8, -(-3 * 50 * 2**20 // one)))  # past 3x the L2 cache
    inputs = []
    for _ in range(sets):
        q = torch.randn(b, s, hq, d, device="cuda", dtype=torch.float16)
        k = torch.randn(b, s, hkv, d, device="cuda", dtype=torch.float16)
        v = torch.randn(b, s, hkv, d, device="cuda", dtype=torch.float16)
        lengths = torch.from_numpy(rng.integers(max(1, s // 4), s + 1, b)).cuda() if kind == "encoder" else None
        if lengths is not None:
            lengths[0] = s  # one full row, as a batch padded to its longest
            keep = torch.arange(s, device="cuda")[None, :] < lengths[:, None]
        else:
            keep = None
        inputs.append((q, k, v, keep))
    out16 = torch.empty(b, s, hq, d, device="cuda", dtype=torch.float16)
    out32 = torch.empty(b, s, hq, d, device="cuda", dtype=torch.float32)
    masks = [None if keep is None else keep.to(torch.int32) for *_, keep in inputs]
    mode = 0 if kind == "decoder" else 4
    ways: dict[str, list[Any]] = {}
    calls = max(2, 4 * sets)

    def pick(i: int) -> tuple[Any, Any, Any, Any, Any]:
        q, k, v, keep = inputs[i % sets]
        return q, k, v, keep, masks[i % sets]

    if kern.has(f"attention_flash_d{d}_f16"):  # the client's default for float16 q (an older attention.cu lacks it)
        ways["gpud flash, f16 out"] = [
            (lambda i=i: flash(kern, *pick(i)[:3], out16, causal, pick(i)[4], mode)) for i in range(calls)
        ]
    ways["gpud flash, f32 out"] = [
        (lambda i=i: flash(kern, *pick(i)[:3], out32, causal, pick(i)[4], mode)) for i in range(calls)
    ]
    splits = max(1, min(-(-s // 256), 64, -(-1024 // (b * s * hq))))
    part = torch.empty(b, s, hq, splits, d + 2, device="cuda", dtype=torch.float32)
    if b * s * s * hq <= 2**31 and not (kind == "decoder" and s > 2048):
        ways["gpud two-pass (before), f32 out"] = [
            (lambda i=i: two_pass(kern, *pick(i)[:3], out32, part, causal, pick(i)[4], mode)) for i in range(calls)
        ]

    def sdpa(i: int, with_mask: bool) -> Any:
        q, k, v, keep, _ = pick(i)
        attn = None if keep is None or not with_mask else keep[:, None, None, :]
        gqa = {"enable_gqa": True} if hq != hkv else {}
        return functional.scaled_dot_product_attention(
            q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), attn_mask=attn, is_causal=causal, **gqa
        )

    label = "torch SDPA, bool mask" if kind == "encoder" else "torch SDPA, causal"
    ways[label] = [(lambda i=i: sdpa(i, True)) for i in range(calls)]
    if kind == "encoder":
        ways["torch SDPA, no mask (flash)"] = [(lambda i=i: sdpa(i, False)) for i in range(calls)]
    us = {way: timed(torch, fns, reps) for way, fns in ways.items()}
    # the flash output against SDPA's on one input set (a sanity check of the timed path)
    flash(kern, *pick(0)[:3], out32, causal, pick(0)[4], mode)
    want = sdpa(0, True).transpose(1, 2)
    diff = (out32 - want.float()).abs()
    flops = 4 * b * hq * s * s * d * (0.5 if causal else 1.0)
    base = us[label]
    row = {
        "kind": kind,
        "B": b,
        "S": s,
        "Hq": hq,
        "Hkv": hkv,
        "D": d,
        "causal": causal,
        "input_sets": sets,
        "us": us,
        "ratio_vs_sdpa": {w: base / t for w, t in us.items()},
        "tflop_s": {w: flops / t / 1e6 for w, t in us.items()},
        "max_abs_diff_vs_sdpa": float(diff.max()),
    }
    return row


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    import torch

    kern = Kernels(torch)
    name = torch.cuda.get_device_name()
    print(f"device: {name}; torch {torch.__version__}; NVRTC compile of attention.cu {kern.compile_s:.2f} s")
    entries = [f"attention_flash_d{d}_{o}" for d in (32, 64, 128) for o in ("f16", "f32")]
    attrs = {entry: kern.attributes(entry) for entry in entries if kern.has(entry)}
    for entry, a in attrs.items():
        print(f"  {entry}: {a}")
    rng = np.random.default_rng()
    print("checks against numpy (float64):")
    checks = check_cases(kern, rng)
    failed = [c["case"] for c in checks if not c["ok"]]
    reps = 5 if args.quick else 15
    rows = []
    for kind, shapes in (("encoder", ENCODER), ("decoder", DECODER)):
        for b, s in shapes:
            rows.append(bench_shape(kern, rng, kind, b, s, reps))
    print(f"\n{'shape':<34} {'way':<34} {'us':>9} {'x SDPA':>7} {'TFLOP/s':>8}")
    for r in rows:
        shape = f"{r['kind']} B={r['B']} S={r['S']} {r['Hq']}/{r['Hkv']}x{r['D']}"
        for way, us in r["us"].items():
            print(f"{shape:<34} {way:<34} {us:9.1f} {r['ratio_vs_sdpa'][way]:7.2f} {r['tflop_s'][way]:8.1f}")
        print(f"{'':<34} max |flash - SDPA| {r['max_abs_diff_vs_sdpa']:.2e}")
    if failed:
        print(f"\nFAILED checks: {failed}")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        payload = {
            "benchmark": "attention-harness",
            "device": name,
            "torch": torch.__version__,
            "python": sys.version.split()[0],
            "nvrtc_compile_s": kern.compile_s,
            "kernels": attrs,
            "checks": checks,
            "results": rows,
        }
        args.json.write_text(json.dumps(payload, indent=1))
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
