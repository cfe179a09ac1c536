"""Matrix products: matmul (x @ w, batched or not, w as (K, N) or PyTorch Linear's (N, K), an
optional bias), accumulated in float32. One row of x per weight matrix (decode) goes to a
matrix-vector kernel that reads each weight once (on CUDA, from 4 float32 rows by a wide Linear
weight, matvec_sx: the same sums, x read once for several rows of w), and so do up to 8 rows but for float16 or bfloat16
x and w of one dtype on CUDA: those go from 2 rows to the tensor cores (a matmul_tc kernel with a tile
sized to the product, whose 16-row tiles match cuBLAS there; on Hopper, wide products with w as (N, K)
to a matmul_wg kernel: its warpgroup instructions, and large ones to matmul_tma: TMA copies feeding
warp-specialized warpgroups; products of few tiles and a long K to matmul_tmak: matmul_tma with K split
over a cluster of blocks, their float32 sums added in block order). On a WebGPU adapter that runs on
the CPU (lavapipe), products with w as (N, K) and K a multiple of 8 go to matmul_nk_<x>_<w>; anything
else to matmul_<x>_<w>. In a graph of rows on CUDA (merged decode), float32 rows by a 16-bit (N, K) w go
to matvec_tc at every row count: its rows' bits do not depend on the instance."""

from __future__ import annotations

from typing import Any

from gpud_client.dtypes import dtype_name
from gpud_client.errors import InvalidArgument
from gpud_client.memo import Memo
from gpud_client.operands import not_a_tensor
from gpud_client.ops.base import PLANS_KEPT, Planned, info_of, of_rows
from gpud_client.ops.elementwise import ElementwiseOps
from gpud_client.ops.matmul_forms import numpy_forms
from gpud_client.tensor import Tensor
from gpud_protocol.ops import OpError, TensorInfo
from gpud_protocol.ops.matmul import (
    ACTIVATIONS,
    BIAS_KINDS,
    DTYPES,
    MATVEC_ROWS,
    SHORT,
    TC_DTYPES,
    matmul_grid,
    matvec_grid,
    matvec_groups,
    mixes_halves,
    out_dtype,
    plan,
    tc_grid,
    tc_kernel,
)
from gpud_protocol.ops.matmul_nk import nk_applies, nk_grid
from gpud_protocol.ops.matmul_tma import tma_grid, tma_kernel
from gpud_protocol.ops.matmul_tmak import tma_splits, tmak_grid, tmak_name
from gpud_protocol.ops.matmul_wg import CAPABILITY, wg_grid, wg_kernel
from gpud_protocol.ops.matvec_sx import sx_grid, sx_kernel
from gpud_protocol.ops.matvec_tc import tf_grid, tf_kernel


class MatmulOps(ElementwiseOps):  # its activations, where a kernel applies none, are ElementwiseOps._unary
    # (shape, strides, its base's shape, strides) of the last view `matmul` found to be its base with the last two
    # axes swapped (a key of `_swaps`)
    _last_swapped: tuple[Any, ...] = (None, None, None, None)
    # (x's info, w's info, transpose_w, the plan) of the last product whose w was a view swapped back to its base
    _last_swapped_plan: tuple[Any, ...] = (None, None, None, None)

    def matmul(
        self,
        x: Any,
        w: Any,
        *,
        transpose_w: bool = False,
        bias: Any = None,
        activation: str | None = None,
        out: Any = None,
        graph: Any = None,
    ) -> Any:
        """activation(x @ w (+ bias)). x: (M, K) or (B, M, K); w: (K, N), or (N, K) with transpose_w (a Linear's
        weight), or batched (B, K, N) / (B, N, K); a 2-D w is shared by every batch. bias: (N,).
        float32, float16 and bfloat16 operands in any mix but float16 with bfloat16 (cast one, as torch
        asks), accumulated in float32; out is x's dtype when w shares it, else float32 (a 16-bit out is
        rounded once, to nearest even). bias: float32, float16 or bfloat16. Shape (M, N), or (B, M, N)
        when x or w is batched; numpy.matmul's other shapes too (`numpy_forms`): a 1-D x or w, and
        batch axes past one, broadcast where one side's are all ones or both sides' are the same. A w
        that is a dense tensor's last two axes swapped (`k.transpose(-1, -2)`) is read in place. On
        CUDA, float16 or bfloat16 x and w with more than 8 rows per weight matrix run on the tensor
        cores: the same exact products summed in float32, in another order; recorded into a graph of
        rows, float32 x by a 16-bit w as (N, K) runs on them for every row count (matvec_tc).
        activation: "gelu" (erf), "gelu_tanh" or "silu": the bits of `gpu.ops.gelu(x @ w + bias)` (its
        unary op on the rounded product), in one launch where the kernel applies it as it stores its
        tiles (Hopper's warpgroup kernels), else the unary op after the product."""
        try:
            xs, ws = x.shape, w.shape
        except AttributeError:
            raise not_a_tensor(w if hasattr(x, "shape") else x) from None
        base = None
        if len(ws) >= 2 and not (w.info.strides is None if type(w) is Tensor else getattr(w, "is_contiguous", True)):
            # w = k.transpose(-1, -2) of a dense k: that k, the other layout
            base = w._base if type(w) is Tensor else None
            if base is not None and not w.offset:  # `_swapped_back` of a session's view, inlined (q @ k.T)
                key = self._last_swapped  # the geometry of the last view found swapped: the same objects again?
                if ws is key[0] and w.strides is key[1] and base.shape is key[2] and base.strides is key[3]:
                    swapped = True  # (every layer's k.T: no tuple hashed)
                else:
                    key = (ws, w.strides, base.shape, base.strides)
                    swapped = _swapped(key)
                    if swapped:
                        self._last_swapped = key
                flipped = base if swapped else w.transpose(-1, -2)
            else:
                flipped = _swapped_back(w)
            if flipped.info.strides is None if type(flipped) is Tensor else flipped.is_contiguous:
                w, ws, transpose_w = flipped, flipped.shape, not transpose_w
        if 2 <= len(xs) <= 3 and 2 <= len(ws) <= 3 and (len(xs) == 2 or len(ws) == 2 or xs[0] == ws[0]):
            wt = bool(transpose_w)
            if bias is None and out is None and activation is None and graph is None:  # q @ k.T, x @ w
                try:  # `_matmul_plan`'s lookup, inlined
                    xi, wi = x.info, w.info
                    last = self._last_swapped_plan  # w swapped back (k of q @ k.T): the last such product's plan?
                    if w is base and xi is last[0] and wi is last[1] and wt is last[2]:
                        plan = last[3]  # (every layer's q @ k.T: no key hashed)
                    else:
                        plan = self._plans.get(("matmul", wt, None, xi, wi, None, None))
                        if plan is not None and w is base:
                            self._last_swapped_plan = (xi, wi, wt, plan)
                except AttributeError:  # not a session's tensor: `_matmul_plan` says what it is
                    plan = None
                if plan is None:
                    plan = self._matmul_plan(x, w, wt, None, None, None)
                # `_execute`'s new output, inlined
                client = self._client
                result = client._output(plan.shape, plan.dtype, getattr(x, "device", None))
                launch = plan.launch
                if launch is not None:
                    kernel = self._packed_kernels.get(launch.name) or self._packed_kernel(launch.name)
                    client._queue_launch(kernel, launch.head, launch.tail, (x, w, x), result._packed, launch.op)
                return result
            plan = self._matmul_plan(x, w, wt, bias, out, activation, of_rows(graph))
            inputs = [x, w, x if bias is None else bias]  # no bias: x stands in (not read)
            if activation is None or fused(plan):
                return self._execute(plan, inputs, out, x, graph)
            product = self._execute(plan, inputs, None, x, graph)  # the kernel applies none: the unary op after
            result = self._unary(activation, product, out, graph)
            if graph is None:
                product.free()  # to the client's pool, once the unary op queued behind it has read it
            return result
        return self._matmul_numpy(x, w, bool(transpose_w), bias, activation, out, graph)

    def _matmul_numpy(self, x: Any, w: Any, wt: bool, bias: Any, activation: str | None, out: Any, graph: Any) -> Any:
        """numpy.matmul's other shapes (1-D operands, more batch axes, a batch of one broadcast) as
        views in the forms the kernels take, into an output of numpy's shape."""
        xd, wd = _operand_dtypes(x, w)
        try:
            x_form, w_form, out_form, shape = numpy_forms(tuple(x.shape), tuple(w.shape), wt)
        except OpError as exc:
            raise InvalidArgument(str(exc), op="matmul") from None
        if out is not None and tuple(out.shape) != shape:
            raise InvalidArgument(f"out is {list(out.shape)}, the product is {list(shape)}", op="matmul")
        result = self._out(out, shape, out_dtype(xd, wd), x, graph)
        try:
            xv, wv, ov = x.reshape(x_form), w.reshape(w_form), result.reshape(out_form)
        except InvalidArgument as exc:
            raise InvalidArgument(str(exc), op="matmul") from None
        self.matmul(xv, wv, transpose_w=wt, bias=bias, activation=activation, out=ov, graph=graph)
        return result

    def _matmul_plan(
        self, x: Any, w: Any, wt: bool, bias: Any, out: Any, activation: str | None = None, rows: bool = False
    ) -> Planned:
        """The plan of `matmul` for these operands (checked when made; see `nn.Linear`, which keeps its own).
        `rows`: recorded into a row-independent graph (`of_rows`)."""
        bi, oi = None if bias is None else info_of(bias), None if out is None else info_of(out)
        try:  # `info_of` and `_plan`'s lookup, inlined
            key = ("matmul", wt, activation, x.info, w.info, bi, oi, rows)
        except AttributeError:
            key = ("matmul", wt, activation, info_of(x), info_of(w), bi, oi, rows)
        try:
            plan: Planned | None = self._plans.get(key)
        except TypeError:
            plan = None
        return self._plan(key, self._plan_matmul, x, w, wt, bias, out, activation, rows) if plan is None else plan

    def _plan_matmul(
        self, x: Any, w: Any, wt: bool, bias: Any, out: Any, activation: str | None, rows: bool
    ) -> Planned:
        xd, wd = _operand_dtypes(x, w)
        epilogue = 0
        if bias is not None:
            bd = dtype_name(bias)
            if bd not in BIAS_KINDS:
                raise InvalidArgument(f"matmul: a float32, float16 or bfloat16 bias, not {bd}")
            epilogue |= BIAS_KINDS[bd]
        try:
            p = plan(tuple(x.shape), tuple(w.shape), wt)
            cuda = self._client.backend == "cuda"
            tensor_cores = xd == wd and xd in TC_DTYPES and cuda
            grouped = None if tensor_cores or p.m <= MATVEC_ROWS else matvec_groups(p)
            # in a graph of rows, every instance (1 row to 64) on the kernels whose rows' bits do not
            # depend on the row count: a merged launch's rows equal solo ones, on the tensor cores
            tf = tf_kernel(p.m, p.n, xd, wd, wt, self._capability(x)) if rows and cuda else None
            if tf is not None:
                name, grid = tf, tf_grid(tf, p.batch, p.n)
            elif p.m == 1 or (p.m <= MATVEC_ROWS and not tensor_cores) or grouped is not None:
                p = grouped or p  # past 8 rows, groups of rows along z: each row's bits as if alone
                name, grid = f"matvec_{SHORT[xd]}_{SHORT[wd]}", matvec_grid(p.batch, p.n, p.k, wt)
                sx = sx_kernel(p.m, p.n, p.k, xd, wd, wt) if cuda else None
                if sx is not None:  # matvec's bits, x read once for several rows of a wide w
                    name, grid = sx, sx_grid(p.batch, p.n, p.k, p.m)
            elif tensor_cores:  # from 2 rows: matmul_tc's 16-row tiles match cuBLAS where matvec did not
                hopper = wt and self._capability(x) == CAPABILITY  # a Linear's weight layout on sm_90
                splits = tma_splits(p.batch, p.m, p.n, p.k, xd) if hopper else 1
                tma = tma_kernel(p.batch, p.m, p.n, p.k, xd) if hopper and splits == 1 else None
                wide = wg_kernel(p.m, p.n, p.k, xd) if hopper and tma is None and splits == 1 else None
                if splits > 1:  # few tiles, a long K: clusters that split K give every multiprocessor work
                    name = tmak_name(xd, splits)
                    grid = tmak_grid(name, p.batch, p.m, p.n)
                elif tma is not None:  # large products: TMA copies and warp-specialized warpgroups
                    name, grid = tma, tma_grid(tma, p.batch, p.m, p.n)
                elif wide is not None:  # Hopper's warpgroup kernels
                    name, grid = wide, wg_grid(wide, p.batch, p.m, p.n)
                else:
                    name = tc_kernel(p.m, p.n, p.k, xd)
                    grid = tc_grid(name, p.batch, p.m, p.n)
            elif nk_applies(p.k, wt) and self._software(x):  # lavapipe: no workgroup memory, no barriers
                name, grid = f"matmul_nk_{SHORT[xd]}_{SHORT[wd]}", nk_grid(p.batch, p.m, p.n)
            else:
                name, grid = f"matmul_{SHORT[xd]}_{SHORT[wd]}", matmul_grid(p.batch, p.m, p.n)
        except OpError as exc:
            raise InvalidArgument(f"matmul: {exc}") from None
        if name.startswith(FUSING):
            epilogue |= _activation_bits(activation)
        else:
            _activation_bits(activation)  # checked here too: the unary op runs after
        result = TensorInfo(out_dtype(xd, wd), p.out_shape) if out is None else out
        tensors = [x, w, x if bias is None else bias, result]  # without a bias, x stands in (not read)
        launch = self._check(name, grid, tensors, [*p.sizes, int(wt), epilogue])
        return Planned(p.out_shape, out_dtype(xd, wd), launch)


def _swapped_back(w: Any) -> Any:
    """w with its last two axes swapped back: where w is its base's `.T` or `transpose(-1, -2)` (q @ k.T),
    the base itself (no new view on the hot path), else a view."""
    if type(w) is Tensor:  # (a session's: q @ k.T every step) its base without the property, the answer kept
        base = w._base
        if base is not None and not w.offset and _swapped((w.shape, w.strides, base.shape, base.strides)):
            return base
        return w.transpose(-1, -2)
    base, strides = getattr(w, "base", w), getattr(w, "strides", None)
    if (
        base is not w
        and strides is not None
        and not w.offset
        and base.strides is not None
        and _swaps_back(tuple(w.shape), strides, tuple(base.shape), tuple(base.strides))
    ):
        return base
    return w.transpose(-1, -2)


# (the shape and strides of a view, and of its base) -> whether the view is the base, last two axes swapped
_swaps: Memo[tuple[tuple[int, ...], ...], bool] = Memo(PLANS_KEPT)


def _swapped(key: tuple[tuple[int, ...], ...]) -> bool:
    """Whether the view of `key` (its shape and strides, its base's) is its base with the last two axes
    swapped, as `_swaps` keeps it."""
    known = _swaps.get(key)
    return _swaps.keep(key, _swaps_back(*key)) if known is None else known


def _swaps_back(shape: tuple[int, ...], strides: Any, base_shape: tuple[int, ...], dense: tuple[int, ...]) -> bool:
    return base_shape == (*shape[:-2], shape[-1], shape[-2]) and strides == (*dense[:-2], dense[-1], dense[-2])


FUSING = ("matmul_wg", "matmul_tma")  # the kernels that apply an activation as they store (the epilogue)


def fused(plan: Planned) -> bool:
    """Whether `plan`'s kernel applies the call's activation itself."""
    return plan.launch is not None and plan.launch.name.startswith(FUSING)


def _activation_bits(activation: str | None) -> int:
    """The epilogue scalar's activation bits (ACTIVATIONS' code << 8); InvalidArgument names the choices."""
    if activation is None:
        return 0
    code = ACTIVATIONS.get(activation) if isinstance(activation, str) else None
    if code is None:
        raise InvalidArgument(f"activation is None or one of {sorted(ACTIVATIONS)}, not {activation!r}", op="matmul")
    return code << 8


def _operand_dtypes(x: Any, w: Any) -> tuple[str, str]:
    """x's and w's dtypes, those the kernels multiply; else InvalidArgument saying which."""
    xd, wd = dtype_name(x), dtype_name(w)
    if xd not in DTYPES or wd not in DTYPES:
        raise InvalidArgument(f"matmul: float32, float16 or bfloat16 operands, not x {xd} and w {wd}")
    if mixes_halves(xd, wd):
        raise InvalidArgument(
            f"matmul: x is {xd} and w {wd}, which no kernel multiplies (nor torch); cast one to the "
            f"other's dtype first, e.g. gpu.ops.cast(x, '{wd}')",
            op="matmul",
        )
    return xd, wd
