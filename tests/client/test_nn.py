"""gpud_client.nn against numpy in float64, eager and recorded into a graph, on every backend."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
from safetensors_writer import write

from gpud_client import Client, InvalidArgument, nn

RNG = np.random.default_rng(3)
F64 = np.float64


def rand(*shape: int, dtype: Any = np.float32) -> np.ndarray[Any, Any]:
    return RNG.standard_normal(shape).astype(dtype)


def close(got: np.ndarray[Any, Any], want: np.ndarray[Any, Any], tol: float = 1e-5) -> None:
    assert got.shape == want.shape
    scale = max(1.0, float(np.abs(want).max()))
    np.testing.assert_allclose(got.astype(F64), want, atol=tol * scale, rtol=0)


@pytest.mark.parametrize("wdtype", [np.float32, np.float16])
@pytest.mark.parametrize("shape", [(24,), (3, 24), (2, 5, 24), (2, 2, 3, 24)])
async def test_linear(gpu: Client, shape: tuple[int, ...], wdtype: Any) -> None:
    w, b, x = rand(10, 24, dtype=wdtype), rand(10, dtype=wdtype), rand(*shape)
    linear = nn.Linear(gpu, gpu.tensor(w), gpu.tensor(b))
    assert (linear.in_features, linear.out_features) == (24, 10)
    got = await linear(gpu.tensor(x)).numpy()
    close(got, x.astype(F64) @ w.astype(F64).T + b.astype(F64))
    plain = nn.Linear(gpu, linear.weight)
    close(await plain(gpu.tensor(x)).numpy(), x.astype(F64) @ w.astype(F64).T)


async def test_norms_and_embedding(gpu: Client) -> None:
    x = rand(4, 3, 32)
    w, b = rand(32), rand(32)
    mean = x.astype(F64).mean(-1, keepdims=True)
    var = ((x - mean) ** 2).mean(-1, keepdims=True)
    want = (x - mean) / np.sqrt(var + 1e-5) * w + b
    close(await nn.LayerNorm(gpu, gpu.tensor(w), gpu.tensor(b))(gpu.tensor(x)).numpy(), want)
    rms = x / np.sqrt((x.astype(F64) ** 2).mean(-1, keepdims=True) + 1e-6) * w
    close(await nn.RMSNorm(gpu, gpu.tensor(w), eps=1e-6)(gpu.tensor(x)).numpy(), rms)
    table = rand(50, 8, dtype=np.float16)
    ids = np.array([[0, 49, 7], [3, 3, 12]], np.int32)
    emb = nn.Embedding(gpu, gpu.tensor(table))
    got = await emb(gpu.tensor(ids)).numpy()
    assert got.dtype == np.float16  # the table's dtype, as torch's embedding
    np.testing.assert_array_equal(got, table[ids])
    np.testing.assert_array_equal(await nn.Embedding(gpu, emb.table, "float32")(gpu.tensor(ids)).numpy(), table[ids])


async def test_layer_norm_of_x_plus_a_residual(gpu: Client) -> None:
    """LayerNorm(x + residual), a post-LN layer's (BERT's): the bits of add then layernorm, eagerly (twice:
    the kept plan) and recorded; numpy's within float32's error; a residual unlike x refused, naming the op."""
    w, b = rand(384), rand(384)
    norm = nn.LayerNorm(gpu, gpu.tensor(w), gpu.tensor(b), eps=1e-12)
    for shape in [(2, 5, 384), (3, 384)]:
        x, r = rand(*shape), rand(*shape)
        xt, rt = gpu.tensor(x), gpu.tensor(r)
        want = await gpu.ops.layernorm(gpu.ops.add(xt, rt), norm.weight, norm.bias, 1e-12).numpy()
        for _ in range(2):
            assert (await norm(xt, residual=rt).numpy()).tobytes() == want.tobytes()
        s = (x + r).astype(F64)  # float32's sum, as add stores it
        mean = s.mean(-1, keepdims=True)
        close(want, (s - mean) / np.sqrt(((s - mean) ** 2).mean(-1, keepdims=True) + 1e-12) * w + b)
    assert len(norm._added) == 2  # a plan per shape
    g = gpu.graph("nn-residual")
    g.output("y", norm(g.input("x", (3, 384), "float32"), graph=g, residual=g.input("r", (3, 384), "float32")))
    step = await g.build()
    assert (await step.replay(x=x, r=r))["y"].tobytes() == want.tobytes()
    with pytest.raises(InvalidArgument, match="layernorm: residual is float16, x is float32"):
        norm(xt, residual=gpu.tensor(r.astype(np.float16)))


def forward(gpu: Client, layers: dict[str, Any], ids: Any, graph: Any = None) -> Any:
    """One forward function, for eager work and for recording: embedding, norm, linear."""
    h = layers["emb"](ids, graph=graph)
    h = layers["norm"](h, graph=graph)
    return layers["proj"](h, graph=graph)


async def test_one_forward_serves_eager_and_graph_from_a_checkpoint(gpu: Client, tmp_path: Path) -> None:
    weights = {
        "emb.weight": rand(20, 16),
        "norm.weight": rand(16),
        "proj.weight": rand(6, 16),
        "proj.bias": rand(6),
    }
    path = write(tmp_path / "tiny.safetensors", weights)
    tensors = await gpu.load_safetensors(path, f"test/nn-{id(path)}/")
    layers = {
        "emb": nn.Embedding.from_dict(gpu, tensors, "emb"),
        "norm": nn.RMSNorm.from_dict(gpu, tensors, "norm", eps=1e-6),
        "proj": nn.Linear.from_dict(gpu, tensors, "proj"),
    }
    ids = np.array([1, 19, 4], np.int32)
    h = weights["emb.weight"][ids].astype(F64)
    h = h / np.sqrt((h**2).mean(-1, keepdims=True) + 1e-6) * weights["norm.weight"]
    want = h @ weights["proj.weight"].astype(F64).T + weights["proj.bias"]
    close(await forward(gpu, layers, gpu.tensor(ids)).numpy(), want)
    g = gpu.graph(f"nn-{id(path)}")
    g.output("y", forward(gpu, layers, g.input("ids", (3,), "int32"), graph=g))
    step = await g.build()
    close((await step.replay(ids=ids))["y"], want)
    for name in weights:
        gpu.unpublish(f"test/nn-{id(path)}/{name}")
        tensors[name].free()


async def test_modules_check_their_tensors(gpu: Client) -> None:
    with pytest.raises(InvalidArgument, match="Linear: weight is"):
        nn.Linear(gpu, gpu.empty((4,)))
    with pytest.raises(InvalidArgument, match=r"bias is \[3\], not \[4\]"):
        nn.Linear(gpu, gpu.empty((4, 2)), gpu.empty((3,)))
    with pytest.raises(InvalidArgument, match="int32"):
        nn.RMSNorm(gpu, gpu.empty((4,), "int32"))
    with pytest.raises(InvalidArgument, match="LayerNorm: bias"):
        nn.LayerNorm(gpu, gpu.empty((4,)), gpu.empty((5,)))
    with pytest.raises(InvalidArgument, match="Embedding: table"):
        nn.Embedding(gpu, gpu.empty((4,)))
    with pytest.raises(InvalidArgument, match="last axis must be 2"):
        nn.Linear(gpu, gpu.empty((4, 2)))(gpu.empty((3, 5)))
