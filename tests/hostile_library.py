"""test_hostile's generators for the op library and views on the wire (issue 14 §2).

Each tenant registers built-in kernels (`gpud:ew_binary`, `gpud:ew_cast`, two fused ones and
`gpud:matvec_f32_f32`) in its setup and keeps tensors of its own for them (`Lib`); the generators here
send raw dispatches of those kernels with lying scalars, tensors and grids, and tensor refs as views
`[handle, offset, [shape], [strides]]` that reach outside their base. Every one must fail with the
code predicted, naming the op, and never run: a valid add, cast and matvec now and then, and the
tenant's readbacks, check the library's tensors.

The generators take the tenant and its batch builder (test_hostile's `Tenant` and `Builder`) and
the expectation makers (`Expectations`), so this module imports nothing from the test.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any, NamedTuple

import numpy as np

from gpud_protocol import ErrorCode, Opcode
from gpud_protocol.ops.broadcast import broadcast_layout
from gpud_protocol.ops.dtypes import DTYPES
from gpud_protocol.ops.elementwise import BINARY_OPS

INVALID, NOT_FOUND, PERMISSION = ErrorCode.INVALID_ARGUMENT, ErrorCode.NOT_FOUND, ErrorCode.PERMISSION_DENIED
TENSOR, F32, U32 = 0, 1, 3
N = 256  # elements of the library's tensors
F32_BYTES = N * 4


class Expectations(NamedTuple):
    ok: Callable[[str, str], Any]
    fails: Callable[..., Any]  # (op, note, *codes, names=a text the error message must hold)
    either: Callable[..., Any]


@dataclasses.dataclass
class Lib:
    """One session's built-in kernels and the tensors it runs them on (float32 [N]: x, y, out; int32 [N])."""

    binary: int | None = None
    cast: int | None = None
    silu: int | None = None  # fused silu_and_mul_f32
    rope: int | None = None  # fused rotary_kv_append_f32_f32
    matvec: int | None = None  # matvec_f32_f32, on 16 x 16 views of the flat tensors
    binary16: int | None = None  # ew_binary16 (CUDA only)
    norm: int | None = None  # layernorm_warp_f32_f32 (CUDA only)
    added_norm: int | None = None  # add_layernorm_warp_f32_f32 (CUDA only)
    matvec_tc: int | None = None  # matvec_tc8_f32_f16 (CUDA only): lying dispatches, never run
    matvec_norm: int | None = None  # matvec_norm_f32_f32_f32 (CUDA only): lying dispatches, never run
    matvec_ro: int | None = None  # matvec_ro_f32_f32 (CUDA only): reads w early, so refused outside a graph
    attention_s2: int | None = None  # attention_s2_f32_f32 (CUDA only): a row's 2 splits in a cluster
    x: int = 0
    y: int = 0
    out: int = 0
    ints: int = 0
    flags: int = 0  # bool [N]: what a comparison writes
    x_values: np.ndarray[Any, Any] | None = None
    y_values: np.ndarray[Any, Any] | None = None


def kernels(backend: str) -> tuple[tuple[str, str], ...]:
    """The built-in kernels the tenants register (name, `Lib` field): the test registers them once before
    its baseline too, so that their first compile's memory (NVRTC's, on CUDA) is not counted as growth."""
    names: tuple[tuple[str, str], ...] = (
        ("ew_binary", "binary"),
        ("ew_cast", "cast"),
        ("silu_and_mul_f32", "silu"),
        ("rotary_kv_append_f32_f32", "rope"),
        ("matvec_f32_f32", "matvec"),
    )
    if backend == "cuda":  # the CUDA backend's own kernels: 16 bytes a thread, a warp a row
        names += (
            ("ew_binary16", "binary16"),
            ("layernorm_warp_f32_f32", "norm"),
            ("add_layernorm_warp_f32_f32", "added_norm"),
            ("matvec_tc8_f32_f16", "matvec_tc"),
            ("matvec_norm_f32_f32_f32", "matvec_norm"),
            ("matvec_ro_f32_f32", "matvec_ro"),
            ("attention_s2_f32_f32", "attention_s2"),
        )
    return names


def setup(t: Any, b: Any, e: Expectations) -> Lib:
    """Register the kernels and make the tensors (kept off the other generators: marked published)."""
    lib = Lib()
    rng = np.random.default_rng(t.rng.getrandbits(32))
    lib.x_values = rng.integers(-1000, 1000, N).astype(np.float32)  # sums and casts exact on every backend
    lib.y_values = rng.integers(-1000, 1000, N).astype(np.float32)
    lib.x, lib.y, lib.out = (t.alloc(b, "float32", (N,)) for _ in range(3))
    lib.ints = t.alloc(b, "int32", (N,))
    lib.flags = t.alloc(b, "bool", (N,))
    t.upload(b, lib.x, lib.x_values.tobytes())
    t.upload(b, lib.y, lib.y_values.tobytes())
    for h in (lib.x, lib.y, lib.out, lib.ints, lib.flags):
        t.tensors[h].published = True  # keeps the other generators from writing or freeing them

    def registered(field: str) -> Callable[[Any, bool], None]:
        def then(sent: Any, failed: bool) -> None:
            if not failed and sent.reply is not None and type(sent.reply.get("handle")) is int:
                setattr(lib, field, sent.reply["handle"])
                t.kernel_handles.add(sent.reply["handle"])

        return then

    for name, field in kernels(t.run.backend):
        b.op(Opcode.KERNEL, [t.new_handle(), f"gpud:{name}", name, {}], e.ok("kernel", name), then=registered(field))
    b.op(
        Opcode.KERNEL,
        [t.new_handle(), "gpud:ew_binary", "main", {}],
        e.fails("kernel", "a built-in kernel under another entry", INVALID, names="entry point"),
    )
    b.op(
        Opcode.KERNEL,
        [t.new_handle(), "gpud:no_such_kernel", "no_such_kernel", {}],
        e.fails("kernel", "an unknown built-in kernel", ErrorCode.NOT_FOUND, names="no_such_kernel"),
    )
    return lib


def _code(dtype: str) -> int:
    return int(DTYPES[dtype].code)


def binary_scalars(n: int = N, op: int = 0) -> list[list[Any]]:
    layout = broadcast_layout((n,), (n,), (n,)).scalars()
    codes = [_code("float32")] * 3
    return [[U32, v] for v in [n, op, *layout, *codes]]


def library(t: Any, b: Any, e: Expectations) -> None:
    """Raw dispatches of the built-in kernels: valid ones checked, hostile ones refused naming the op."""
    lib: Lib = t.lib
    if lib.binary is None or lib.cast is None or lib.x_values is None or lib.y_values is None:
        return
    rng = t.rng
    tensors = [[TENSOR, lib.x], [TENSOR, lib.y], [TENSOR, lib.out]]
    scalars = binary_scalars()
    kind = rng.randrange(21)
    what, args, codes, names = "", tensors + scalars, (INVALID,), "ew_binary"
    if kind == 20:
        _cuda_only(t, b, e)
        return
    if kind == 17:
        _matvec(t, b, e)
        return
    if kind == 18:
        _compare(t, b, e)
        return
    if kind == 0:  # a valid add, its result read back
        b.op(Opcode.DISPATCH, [lib.binary, [1, 1, 1], args, None], e.ok("dispatch", "add (ew_binary)"))
        t.tensors[lib.out].data = (lib.x_values + lib.y_values).astype(np.float32).tobytes()
        return
    if kind == 1:  # a valid cast to int32
        cast_args = [[TENSOR, lib.x], [TENSOR, lib.ints], [U32, N], [U32, _code("float32")], [U32, _code("int32")]]
        b.op(Opcode.DISPATCH, [lib.cast, [1, 1, 1], cast_args, None], e.ok("dispatch", "cast (ew_cast)"))
        t.tensors[lib.ints].data = lib.x_values.astype(np.int32).tobytes()
        return
    if kind == 2:
        args, what = tensors + scalars[: rng.randrange(len(scalars))], "too few scalars"
    elif kind == 3:
        args, what = tensors + scalars + [[U32, 0]], "an extra scalar"
    elif kind == 4:
        args, what = tensors[:2] + scalars, "two tensors for three"
    elif kind == 5:
        i = rng.randrange(len(scalars))
        args, what = tensors + scalars[:i] + [[F32, 1.0]] + scalars[i + 1 :], f"f32 for u32 scalar {i}"
    elif kind == 6:
        n = rng.choice([N + 1, N - 1, 0, 2**32 - 1, 1 << 20])
        args, what = [*tensors, [U32, n], *scalars[1:]], f"n {n} for {N} elements"
    elif kind == 7:
        i = len(scalars) - 1 - rng.randrange(3)
        lie = rng.choice([c for name, c in ((k, v.code) for k, v in DTYPES.items()) if name != "float32"] + [99])
        args, what = tensors + scalars[:i] + [[U32, lie]] + scalars[i + 1 :], f"dtype code {lie} that lies"
    elif kind == 8:
        layout = rng.choice(
            [
                [6, N, 1, 1, 1, 1, 1, 0, 0],
                [1, N * 2, 1, 1, 1, 1, 1, 0, 0],
                [1, N, 1, 1, 1, 1, 1, 1, 0],
                [0, 1, 1, 1, 1, 1, 1, 0, 0],
                [2, 16, 16, 1, 1, 1, 1, 0, 0],
                [7, N, 1, 1, 1, 1, 1, 63, 63],
            ]
        )
        args, what = tensors + scalars[:2] + [[U32, v] for v in layout] + scalars[11:], f"a lying layout {layout}"
    elif kind == 9:
        unknown = rng.choice([max(BINARY_OPS.values()) + 1, 99, 2**32 - 1])
        args, what = [*tensors, [U32, N], [U32, unknown], *scalars[2:]], "an unknown op code"
    elif kind == 10:  # tensors that break the rule: another shape, another dtype
        other = rng.choice([t.pick(lambda i: i.shape != (N,)), lib.ints])
        if other is None:
            return
        args, what = [tensors[0], [TENSOR, other], tensors[2], *scalars], "y of another shape or dtype"
    elif kind == 11:
        args, what = [tensors[0], tensors[1], tensors[0], *scalars], "out is x (in place)"
        codes = (INVALID,)
        # WebGPU refuses a buffer bound read-only and read-write; the rule of the op allows it: either
        b.op(Opcode.DISPATCH, [lib.binary, [1, 1, 1], args, None], e.either("dispatch", what, INVALID))
        t.tensors[lib.x].data = None
        lib.x_values = None  # unknown from now on: no more valid adds this life
        return
    elif kind == 12 and t.opened:
        ro = rng.choice(list(t.opened))
        _name, published = t.opened[ro]
        if published.shape != (N,) or published.dtype != "float32":
            return
        args, what, codes, names = (
            [*tensors[:2], [TENSOR, ro], *scalars],
            "out= a read-only resident",
            (PERMISSION,),
            "out",
        )
    elif kind == 13:
        grid = rng.choice([[1, 1 << 20, 1], [1, 1, 1 << 17], [1, 65536, 65536]])
        args, what, names = tensors + scalars, f"grid {grid} past the device limit", "grid"
        b.op(Opcode.DISPATCH, [lib.binary, grid, args, None], e.fails("dispatch", what, *codes, names=names))
        return
    elif kind == 14:
        args, what = (
            [[TENSOR, lib.x], [TENSOR, lib.out], [U32, N], [U32, _code("int32")], [U32, _code("float32")]],
            "cast x_dtype lies",
        )
        b.op(Opcode.DISPATCH, [lib.cast, [1, 1, 1], args, None], e.fails("dispatch", what, INVALID, names="ew_cast"))
        return
    elif kind in (15, 16):  # the fused kernels, given the library's flat tensors and lying sizes
        kernel, name = (lib.silu, "silu_and_mul") if kind == 15 else (lib.rope, "rotary_kv_append")
        if kernel is None:
            return
        if kind == 15:
            n, width = rng.choice([(N // 2, N // 2), (N, N // 2), (2**32 - 1, 1), (N // 2, N)])
            args = [[TENSOR, lib.x], [TENSOR, lib.out], [U32, n], [U32, width]]
        else:  # qkv, pos, q, k_cache, v_cache; none of the shapes fits, whatever the sizes say
            sizes = [rng.choice([N // 4, N, 2**32 - 1]), 1, 2, 1, 8, rng.choice([4, 0, 2**31]), 0]
            flat = [[TENSOR, h] for h in (lib.x, lib.ints, lib.out, lib.y, lib.y)]
            args = [*flat, *([U32, v] for v in sizes), [F32, 0.5], [F32, 0.0]]
        what = f"{name} on flat tensors with lying sizes"
        b.op(Opcode.DISPATCH, [kernel, [1, 1, 1], args, None], e.fails("dispatch", what, INVALID, names=name))
        return
    else:
        foreign = t.run.foreign_handle(t.index, rng)
        args, what, codes, names = (
            [tensors[0], [TENSOR, foreign], tensors[2], *scalars],
            "another session's y",
            (NOT_FOUND,),
            "unknown",
        )
    b.op(Opcode.DISPATCH, [lib.binary, [1, 1, 1], args, None], e.fails("dispatch", what, *codes, names=names))


def _compare(t: Any, b: Any, e: Expectations) -> None:
    """ew_binary's comparisons: x > y into a bool tensor, valid and checked; or what they may not
    write: a comparison into float32, an add into bool, a cast into bool, all refused."""
    lib: Lib = t.lib
    if lib.x_values is None or lib.y_values is None:
        return
    f32, flag = _code("float32"), _code("bool")
    layout = broadcast_layout((N,), (N,), (N,)).scalars()
    x, y = [TENSOR, lib.x], [TENSOR, lib.y]

    def binary(op: str, out: int, out_code: int) -> list[Any]:
        return [x, y, [TENSOR, out], *([U32, v] for v in [N, BINARY_OPS[op], *layout, f32, f32, out_code])]

    case = t.rng.randrange(4)
    if case == 0:
        b.op(
            Opcode.DISPATCH,
            [lib.binary, [1, 1, 1], binary("greater", lib.flags, flag), None],
            e.ok("dispatch", "greater"),
        )
        t.tensors[lib.flags].data = (lib.x_values > lib.y_values).astype(np.uint8).tobytes()
        return
    if case == 1:
        what, args, kernel = "a comparison into float32", binary("less", lib.out, f32), lib.binary
    elif case == 2:
        what, args, kernel = "an add into bool", binary("add", lib.flags, flag), lib.binary
    else:
        what, kernel = "a cast into bool", lib.cast
        args = [x, [TENSOR, lib.flags], [U32, N], [U32, f32], [U32, flag]]
    b.op(Opcode.DISPATCH, [kernel, [1, 1, 1], args, None], e.fails("dispatch", what, INVALID, names="ew_"))


def _cuda_only(t: Any, b: Any, e: Expectations) -> None:
    """The CUDA backend's own kernels, raw: ew_binary16 (a valid add, or broadcasting and lengths it does not
    take), layernorm_warp and add_layernorm_warp over the flat tensors as one row (valid, their bits unknown
    here; or sizes that lie, a row past a warp, a residual of another dtype), refused naming the kernel."""
    lib: Lib = t.lib
    if lib.binary16 is None or lib.norm is None or lib.added_norm is None or lib.x_values is None:
        return
    if lib.y_values is None:
        return
    x, y, out, ints = ([TENSOR, h] for h in (lib.x, lib.y, lib.out, lib.ints))
    what = t.rng.choice(
        ["add", "broadcast", "odd n", "norm", "norm rows", "a row past x", "added", "added ints", "cluster"]
    )
    if what == "cluster":
        _attention_cluster(t, b, e)
        return
    if what == "add":
        b.op(Opcode.DISPATCH, [lib.binary16, [1, 1, 1], [x, y, out, *binary_scalars()], None], e.ok("dispatch", what))
        t.tensors[lib.out].data = (lib.x_values + lib.y_values).astype(np.float32).tobytes()
        return
    if what in ("broadcast", "odd n"):
        scalars = binary_scalars()
        if what == "broadcast":
            scalars[-5] = [U32, 1]  # x_bcast: x read as broadcast along the axis
        else:
            scalars[0] = [U32, N - 1]
        b.op(
            Opcode.DISPATCH,
            [lib.binary16, [1, 1, 1], [x, y, out, *scalars], None],
            e.fails("dispatch", what, INVALID, names="ew_binary16"),
        )
        return
    rows, length = {"norm rows": (2, N), "a row past x": (1, 2 * N)}.get(what, (1, N))
    sizes = [[U32, rows], [U32, length], [F32, 1e-5]]
    if what.startswith("added"):
        kernel, name, tensors = (
            lib.added_norm,
            "add_layernorm_warp",
            [x, ints if what == "added ints" else y, y, y, out],
        )
    else:
        kernel, name, tensors = lib.norm, "layernorm_warp", [x, y, y, out]
    if what in ("norm", "added"):
        b.op(Opcode.DISPATCH, [kernel, [1, 1, 1], [*tensors, *sizes], None], e.ok("dispatch", f"{name}: {what}"))
        t.tensors[lib.out].data = None  # float arithmetic: its bits are not predicted here
        return
    b.op(Opcode.DISPATCH, [kernel, [1, 1, 1], [*tensors, *sizes], None], e.fails("dispatch", what, INVALID, names=name))


def _attention_cluster(t: Any, b: Any, e: Expectations) -> None:
    """attention_s2_f32_f32 (two splits of a row merged in a cluster) on views of the flat tensors: 2 query
    heads of 8 against 8 keys, valid (its bits not predicted here), or with 4 splits for its 2, refused."""
    lib: Lib = t.lib
    if lib.attention_s2 is None:
        return
    q, out = ([TENSOR, [h, 0, [1, 2, 8], [16, 8, 1]]] for h in (lib.x, lib.out))
    kv = [TENSOR, [lib.y, 0, [1, 8, 1, 8], [64, 8, 8, 1]]]
    splits = t.rng.choice([2, 4])
    scalars = [*([U32, v] for v in (1, 1, 8, 2, 1, 8, splits, 0, 0, 0)), [F32, 0.125]]
    op = [lib.attention_s2, [4, 1, 1], [q, kv, kv, q, q, out, *scalars], None]
    if splits == 2:
        b.op(Opcode.DISPATCH, op, e.ok("dispatch", "attention in a cluster"))
        t.tensors[lib.out].data = None  # float arithmetic: its bits are not predicted here
    else:
        b.op(Opcode.DISPATCH, op, e.fails("dispatch", "4 splits for 2", INVALID, names="splits is 2"))


ROWS = 16  # the matvec's x, w and out: 16 x 16 views of the flat tensors (x, y, out)


def _matvec(t: Any, b: Any, e: Expectations) -> None:
    """matvec on 16 x 16 views: its rows as two groups of 8 along z (matvec_groups), valid and checked,
    or sizes whose groups lie (past x's rows, overlapping, more than 8 rows a group), refused; on CUDA
    now and then matvec_tc8's rule broken (w as (K, N), more rows than it takes, a float32 w),
    matvec_norm's (more rows than it takes, a sum or a residual unlike x), and matvec_ro dispatched
    outside a replay graph, refused."""
    lib: Lib = t.lib
    if lib.matvec is None:
        return
    x, w, out = ([h, 0, [ROWS, ROWS], [ROWS, 1]] for h in (lib.x, lib.y, lib.out))
    if lib.matvec_norm is not None and t.rng.random() < 0.2:
        _matvec_norm_lies(t, b, e, w)
        return
    if lib.matvec_ro is not None and t.rng.random() < 0.1:  # arguments its rule takes, but a dispatch of its own
        xv, ov = ([h, 0, [8, ROWS], [ROWS, 1]] for h in (lib.x, lib.out))
        args = [
            [TENSOR, xv],
            [TENSOR, w],
            [TENSOR, xv],
            [TENSOR, ov],
            *([U32, v] for v in [1, 8, ROWS, ROWS, 0, 0, 1, 0]),
        ]
        what = "matvec_ro outside a replay graph"
        b.op(
            Opcode.DISPATCH,
            [lib.matvec_ro, [1, 1, 1], args, None],
            e.fails("dispatch", what, INVALID, names="replay graph"),
        )
        return
    if lib.matvec_tc is not None and t.rng.random() < 0.25:  # the tensor-core matvec's rule, on float32 w
        lies = {  # (m, wt, what the refusal says): its rule refuses the first of them it meets
            "wt 0 (w as (K, N))": (8, 0, "wt 1"),
            "16 rows for 8": (ROWS, 1, "1 to 8 rows"),
            "a float32 w": (8, 1, "w float16"),
        }
        what = t.rng.choice(list(lies))
        m, wt, names = lies[what]
        xv = [lib.x, 0, [m, ROWS], [ROWS, 1]]
        ov = [lib.out, 0, [m, ROWS], [ROWS, 1]]
        args = [
            [TENSOR, xv],
            [TENSOR, w],
            [TENSOR, xv],
            [TENSOR, ov],
            *([U32, v] for v in [1, m, ROWS, ROWS, 0, 0, wt, 0]),
        ]
        b.op(Opcode.DISPATCH, [lib.matvec_tc, [1, 1, 1], args, None], e.fails("dispatch", what, INVALID, names=names))
        return
    sizes = {
        "two groups of 8": [2, 8, ROWS, ROWS, 8 * ROWS, 0],
        "groups past x's rows": [4, 8, ROWS, ROWS, 8 * ROWS, 0],
        "groups that overlap": [2, 8, ROWS, ROWS, 4 * ROWS, 0],
        "16 rows in one group": [1, ROWS, ROWS, ROWS, 0, 0],
    }
    what = t.rng.choice(list(sizes))
    args = [[TENSOR, x], [TENSOR, w], [TENSOR, x], [TENSOR, out], *([U32, v] for v in [*sizes[what], 1, 0])]
    if what != "two groups of 8":
        b.op(Opcode.DISPATCH, [lib.matvec, [2, 1, 2], args, None], e.fails("dispatch", what, INVALID, names="matvec"))
        return
    if lib.x_values is None or lib.y_values is None:
        return
    b.op(Opcode.DISPATCH, [lib.matvec, [2, 1, 2], args, None], e.ok("dispatch", f"matvec: {what}"))
    xs, ws = (v.reshape(ROWS, ROWS).astype(np.float64) for v in (lib.x_values, lib.y_values))
    t.tensors[lib.out].data = (xs @ ws.T).astype(np.float32).tobytes()  # integers below 2^24: exact


def _matvec_norm_lies(t: Any, b: Any, e: Expectations, w: list[Any]) -> None:
    """matvec_norm_f32_f32_f32 with one part of its rule broken, refused (nothing runs)."""
    lib: Lib = t.lib
    lies = {  # (rows of x, the residual's tensor, the sum's rows, what the refusal says)
        "3 rows for 2": (3, lib.y, 3, "1 to 2 rows"),
        "an int32 residual": (1, lib.ints, 1, "res is int32"),
        "a sum of another shape": (1, lib.y, 2, "sum is float32 [2, 16]"),
    }
    what = t.rng.choice(list(lies))
    m, res, sum_rows, names = lies[what]
    xv = [lib.x, 0, [m, ROWS], [ROWS, 1]]
    args = [
        [TENSOR, xv],
        [TENSOR, [res, 0, [m, ROWS], [ROWS, 1]]],
        [TENSOR, [lib.x, 0, [ROWS], [1]]],
        [TENSOR, w],
        [TENSOR, xv],
        [TENSOR, [lib.out, 0, [sum_rows, ROWS], [ROWS, 1]]],
        [TENSOR, [lib.out, 8 * ROWS, [m, ROWS], [ROWS, 1]]],
        *([U32, v] for v in [m, ROWS, ROWS]),
        [F32, 1e-6],
        [U32, 0],
    ]
    b.op(Opcode.DISPATCH, [lib.matvec_norm, [1, 1, 1], args, None], e.fails("dispatch", what, INVALID, names=names))


# ---------------------------------------------------------------------------- views on the wire


def views(t: Any, b: Any, e: Expectations) -> None:
    """Tensor refs as views: valid ones read back, ones that reach outside their base refused."""
    lib: Lib = t.lib
    if not lib.x:
        return
    rng = t.rng
    x, out = lib.x, lib.out
    xdata = t.tensors[x].data
    kind = rng.randrange(12)
    codes: tuple[int, ...] = (INVALID,)
    if kind == 0:  # valid: a contiguous view at an offset, and a strided one (its span comes back)
        if rng.random() < 0.5:
            view, lo, hi = [x, 64, [64], [1]], 256, 512
        else:
            view, lo, hi = [x, 3, [4], [64]], 12, 4 * (3 + 1 + 3 * 64)
        data = None if xdata is None else xdata[lo:hi]
        b.op(Opcode.READBACK, [view], e.ok("readback", f"a view {view}"), nbytes=hi - lo, data=data)
        return
    if kind == 1:  # valid: a copy of a view into a view
        src, dst = [x, 0, [64], [1]], [out, 128, [64], [1]]
        b.op(Opcode.COPY, [src, dst], e.ok("copy", "a view into a view"))
        before = t.tensors[out].data
        t.tensors[out].data = None if before is None or xdata is None else before[:512] + xdata[:256] + before[768:]
        return
    if kind == 2:
        view, what = rng.choice(
            [
                ([x, -1, [4], [1]], "a negative offset"),
                ([x, 0, [4], [-1]], "a negative stride"),
                ([x, 8, [2, 2], [-4, 1]], "a negative stride"),
                ([x, 0, [4, 4], [4]], "fewer strides than dims"),
                ([x, 0, [16], [1, 1]], "more strides than dims"),
                ([x, 0, [1] * 9, [1] * 9], "9 dims"),
                ([x, 0, [1] * 64, [1] * 64], "64 dims"),
                ([x, 0, [2**40], [1]], "a huge dim"),
                ([x, 2**40, [1], [1]], "a huge offset"),
                ([x, 0, [2, 2], [2**40, 1]], "a huge stride"),
                ([x, 0, [4]], "three fields"),
                ([x, 0, [4], [1], 0], "five fields"),
                ([0, 0, [4], [1]], "handle 0"),
                ([x, 0.0, [4], [1]], "a float offset"),
                ([x, 0, "4", [1]], "a str shape"),
            ]
        )
    elif kind in (3, 4, 5):
        view, what = rng.choice(
            [
                ([x, N - 63, [64], [1]], "reaching one past the base"),
                ([x, N, [1], [1]], "starting at the base's end"),
                ([x, 0, [2, N], [N, 1]], "twice the base"),
                ([x, 0, [3], [N // 2]], "a stride past the base"),
                ([x, 200, [8, 8], [1, 8]], "a transposed view past the base"),
                ([x, 10**9, [1], [1]], "far past the base"),
            ]
        )
    elif kind == 6:
        view, what, codes = (
            [t.run.foreign_handle(t.index, rng), 0, [4], [1]],
            "a view of another session's tensor",
            (NOT_FOUND,),
        )
    elif kind == 7:
        view, what, codes = [t.stale_handle(), 0, [4], [1]], "a view of a stale handle", (NOT_FOUND,)
    else:
        view, what = [x, 0, [2, 2], [1, 4]], "a non-contiguous view where a dense one is needed"
        where = rng.randrange(3)
        if where == 0:
            b.op(Opcode.UPLOAD, [view, b.frame(bytes(16)), 16], e.fails("upload", what, INVALID))
        elif where == 1:
            b.op(Opcode.COPY, [[x, 0, [4], [1]], view], e.fails("copy", what, INVALID))
        elif t.opened and (ro := rng.choice(list(t.opened))):
            b.op(
                Opcode.UPLOAD,
                [[ro, 0, [4], [1]], b.frame(bytes(16)), 16],
                e.fails("upload", "a view of a ro resident", PERMISSION),
            )
        return
    _use(t, b, e, view, what, codes)


def _use(t: Any, b: Any, e: Expectations, view: list[Any], what: str, codes: tuple[int, ...]) -> None:
    """Send a bad view where a tensor ref goes: a readback, a copy, an upload, a dispatch argument, a free."""
    lib: Lib = t.lib
    where = t.rng.randrange(6)
    if where == 0:
        b.op(Opcode.READBACK, [view], e.fails("readback", what, *codes))
    elif where == 1:
        b.op(Opcode.COPY, [view, [lib.out, 0, [4], [1]]], e.fails("copy", f"from {what}", *codes))
    elif where == 2:
        b.op(Opcode.COPY, [[lib.x, 0, [4], [1]], view], e.fails("copy", f"into {what}", *codes))
    elif where == 3:
        b.op(Opcode.UPLOAD, [view, b.frame(bytes(16)), 16], e.fails("upload", what, *codes))
    elif where == 4 and lib.binary is not None:
        args = [[TENSOR, view], [TENSOR, lib.y], [TENSOR, lib.out], *binary_scalars()]
        b.op(Opcode.DISPATCH, [lib.binary, [1, 1, 1], args, None], e.fails("dispatch", f"x is {what}", *codes))
    else:
        b.op(Opcode.FREE, [view], e.fails("free", f"{what} (free takes a handle)", INVALID))
