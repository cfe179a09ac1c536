"""Layers over the op library, in PyTorch's layouts: what a forward function would otherwise spell out.

    emb = nn.Embedding(gpu, w["model.embed_tokens.weight"])
    q = nn.Linear(gpu, w["model.layers.0.self_attn.q_proj.weight"], w["model.layers.0.self_attn.q_proj.bias"])
    norm = nn.RMSNorm(gpu, w["model.norm.weight"], eps=1e-6)
    h = q(norm(emb(ids)))                  # eager: queued dispatches, as gpu.ops
    h = q(norm(emb(ids, graph=g), graph=g), graph=g)   # the same forward, recorded into a graph

Each module holds device tensors (yours, or resident ones opened read-only) and is called as
`module(x, graph=None)`: one forward function serves eager work and graph recording. Outputs are
new tensors (graph intermediates when recording), as the op library makes them. `from_dict` picks
a layer's tensors from a checkpoint's dict by name (`load_safetensors`, `open_prefix`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from gpud_client.dtypes import dtype_name, name_of
from gpud_client.errors import InvalidArgument
from gpud_client.memo import Memo
from gpud_client.ops.base import Planned, info_of, of_rows
from gpud_client.ops.matmul import fused
from gpud_client.ops.norms import AddNorm
from gpud_protocol.ops import TensorInfo
from gpud_protocol.ops.matmul import ACTIVATIONS, mixes_halves

if TYPE_CHECKING:
    from gpud_client.client import Client

FLOATS = ("float32", "float16", "bfloat16")
PLANS = 64  # a Linear's plans kept: one per shape and dtype of x it is called with


def _check(module: str, what: str, tensor: Any, ndim: int, shape: tuple[int, ...] | None = None) -> None:
    dtype = name_of(tensor.dtype)
    if dtype not in FLOATS:
        raise InvalidArgument(f"{module}: {what} is {dtype}, not one of {list(FLOATS)}", op=module)
    if len(tensor.shape) != ndim or (shape is not None and tuple(tensor.shape) != shape):
        want = f"{list(shape)}" if shape is not None else f"{ndim}-D"
        raise InvalidArgument(f"{module}: {what} is {list(tensor.shape)}, not {want}", op=module)


class Linear:
    """y = x @ weight.T + bias, weight (out_features, in_features) as PyTorch stores it, bias (out,).
    x is (..., in_features); y is (..., out_features): x's dtype when the weight shares it (float16,
    bfloat16), else float32; float16 with bfloat16 is refused (cast x to the weight's dtype). With
    `activation` ("gelu", "gelu_tanh", "silu"): that op of y, as matmul's `activation=` (BERT's
    intermediate dense layer and its GELU: one launch where the kernel applies it)."""

    def __init__(self, gpu: Client, weight: Any, bias: Any = None, activation: str | None = None) -> None:
        _check("Linear", "weight", weight, 2)
        self.out_features, self.in_features = (int(d) for d in weight.shape)
        if bias is not None:
            _check("Linear", "bias", bias, 1, (self.out_features,))
        if activation is not None and activation not in ACTIVATIONS:
            raise InvalidArgument(f"Linear: activation is None or one of {sorted(ACTIVATIONS)}, not {activation!r}")
        self.gpu, self.weight, self.bias, self.activation = gpu, weight, bias, activation
        self._plans: Memo[TensorInfo, Planned] = Memo(PLANS)  # by x's info: matmul's plan, checked once

    @classmethod
    def from_dict(cls, gpu: Client, tensors: Mapping[str, Any], name: str, activation: str | None = None) -> Linear:
        """`name + ".weight"` and, if present, `name + ".bias"` of `tensors`."""
        return cls(gpu, tensors[f"{name}.weight"], tensors.get(f"{name}.bias"), activation)

    def __call__(self, x: Any, graph: Any = None) -> Any:
        info = info_of(x)
        plan = None if of_rows(graph) else self._plans.get(info)  # a graph of rows plans its own (matmul)
        if plan is not None:  # every call after the first of its shape and dtype: no checks, one lookup
            ops = self.gpu.ops
            return ops._execute(plan, [x, self.weight, x if self.bias is None else self.bias], None, x, graph)
        shape = tuple(x.shape)
        if not shape or shape[-1] != self.in_features:
            raise InvalidArgument(f"Linear: x is {list(shape)}, its last axis must be {self.in_features}", op="Linear")
        xd, wd = dtype_name(x), dtype_name(self.weight)
        if mixes_halves(xd, wd):
            raise InvalidArgument(
                f"Linear: x is {xd} and the weight {wd}, which matmul does not mix (nor torch); cast x first: "
                f"gpu.ops.cast(x, '{wd}')",
                op="Linear",
            )
        matmul, act = self.gpu.ops.matmul, self.activation
        if len(shape) in (2, 3):  # what matmul takes as it is
            plan = self.gpu.ops._matmul_plan(x, self.weight, True, self.bias, None, act, of_rows(graph))
            if (act is None or fused(plan)) and not of_rows(graph):  # one launch: kept for the next calls
                self._plans.keep(info, plan)
            return matmul(x, self.weight, transpose_w=True, bias=self.bias, activation=act, graph=graph)
        rows = x.reshape(math.prod(shape[:-1]), self.in_features)  # a view: no copy
        y = matmul(rows, self.weight, transpose_w=True, bias=self.bias, activation=act, graph=graph)
        return y.reshape(*shape[:-1], self.out_features)


class LayerNorm:
    """(x - mean) / sqrt(var + eps) * weight + bias over the last axis (torch.nn.LayerNorm). Called with
    `residual=` (x's shape and dtype): the norm of x + residual, the sum rounded to x's dtype first (a
    post-LN transformer's LayerNorm(x + sublayer(x)), as `gpu.ops.layernorm(..., residual=)`: one launch
    on CUDA where a row fits a warp)."""

    def __init__(self, gpu: Client, weight: Any, bias: Any, eps: float = 1e-5) -> None:
        _check("LayerNorm", "weight", weight, 1)
        _check("LayerNorm", "bias", bias, 1, tuple(weight.shape))
        self.gpu, self.weight, self.bias, self.eps = gpu, weight, bias, float(eps)
        self._plans: Memo[TensorInfo, Planned] = Memo(PLANS)
        self._added: Memo[tuple[TensorInfo, TensorInfo], AddNorm] = Memo(PLANS)  # by x's and residual's infos

    @classmethod
    def from_dict(cls, gpu: Client, tensors: Mapping[str, Any], name: str, eps: float = 1e-5) -> LayerNorm:
        return cls(gpu, tensors[f"{name}.weight"], tensors[f"{name}.bias"], eps)

    def __call__(self, x: Any, graph: Any = None, *, residual: Any = None) -> Any:
        params = (self.weight, self.bias)
        if residual is None:
            return _norm(self.gpu, self._plans, "layernorm", x, params, self.eps, graph)
        ops, key = self.gpu.ops, (info_of(x), info_of(residual))
        plan = self._added.get(key) or self._added.keep(key, ops._add_norm_plan(x, residual, params, self.eps, None))
        if plan.fused is None:  # add, then layernorm
            return ops.layernorm(x, *params, self.eps, residual=residual, graph=graph)
        return ops._execute(plan.fused, [x, residual, *params], None, x, graph)


class RMSNorm:
    """x / sqrt(mean(x^2 over the last axis) + eps) * weight (Llama's and Qwen's RMSNorm)."""

    def __init__(self, gpu: Client, weight: Any, eps: float = 1e-6) -> None:
        _check("RMSNorm", "weight", weight, 1)
        self.gpu, self.weight, self.eps = gpu, weight, float(eps)
        self._plans: Memo[TensorInfo, Planned] = Memo(PLANS)

    @classmethod
    def from_dict(cls, gpu: Client, tensors: Mapping[str, Any], name: str, eps: float = 1e-6) -> RMSNorm:
        return cls(gpu, tensors[f"{name}.weight"], eps)

    def __call__(self, x: Any, graph: Any = None) -> Any:
        return _norm(self.gpu, self._plans, "rmsnorm", x, (self.weight,), self.eps, graph)


def _norm(
    gpu: Client, plans: Memo[TensorInfo, Planned], op: str, x: Any, params: tuple[Any, ...], eps: float, graph: Any
) -> Any:
    """A norm layer's call: its plan for x's info, made (and checked) by the op library on the first call."""
    info = info_of(x)
    plan = plans.get(info) or plans.keep(info, gpu.ops._norm_plan(op, x, params, eps, None))
    return gpu.ops._execute(plan, [x, *params], None, x, graph)


class Embedding:
    """table[ids]: ids (...) int32, uint32, int64 or uint64, table (num_embeddings, dim) -> (..., dim), in the
    table's dtype unless `dtype` is given. An id outside the table gives a row of zeros."""

    def __init__(self, gpu: Client, table: Any, dtype: str | None = None) -> None:
        _check("Embedding", "table", table, 2)
        self.num_embeddings, self.dim = (int(d) for d in table.shape)
        self.dtype = name_of(table.dtype) if dtype is None else str(dtype)
        self.gpu, self.table = gpu, table

    @classmethod
    def from_dict(cls, gpu: Client, tensors: Mapping[str, Any], name: str, dtype: str | None = None) -> Embedding:
        return cls(gpu, tensors[f"{name}.weight"], dtype)

    def __call__(self, ids: Any, graph: Any = None) -> Any:
        return self.gpu.ops.embedding(ids, self.table, dtype=self.dtype, graph=graph)
