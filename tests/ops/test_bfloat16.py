"""bfloat16 tensors on every backend: storage, upload and readback, views, casts, the elementwise ops,
contiguous, replay graphs and residents, and matmul and attention taking it (float16 with bfloat16 refused).

References are numpy's float32 arithmetic rounded to bfloat16 on the bits (gpud_client.dtypes, whose
rounding tests/client/test_dtypes.py checks against references written another way): add, sub, mul,
maximum, minimum, where and every cast are bit-exact (NaN, infinities, subnormals, ties); the rest are
within one bfloat16 rounding (2^-8 relative) of float64 plus float32's error. Sizes are odd, so two
threads write the halves of an output's last word; outputs are poisoned."""

from __future__ import annotations

import numpy as np
import pytest

import gpud_client
from gpud_client import InvalidArgument, bfloat16, nn
from gpud_client.dtypes import bits_to_float32, float32_to_bits

EVERY = np.arange(0x10000, dtype=np.uint32).astype(np.uint16)  # every bfloat16


def bf(values: object) -> np.ndarray:
    """float32 values rounded to bfloat16 (as float32)."""
    rounded: np.ndarray = bits_to_float32(float32_to_bits(np.asarray(values, np.float32)))
    return rounded


def bits_of(got: np.ndarray) -> np.ndarray:
    """The bfloat16 bits of float32 values read back from a bfloat16 tensor (their low halves are zero)."""
    assert got.dtype == np.float32
    assert not (got.view(np.uint32) & 0xFFFF).any(), "a float32 that no bfloat16 equals"
    return (got.view(np.uint32) >> 16).astype(np.uint16)


def poisoned(gpu: gpud_client.Client, shape: tuple[int, ...], dtype: str = "bfloat16") -> gpud_client.Tensor:
    return gpu.tensor(np.full(shape, np.nan, np.float32), dtype=dtype)


def rand(shape: tuple[int, ...], scale: float = 1.0) -> np.ndarray:
    """bfloat16 values (as float32) of a normal distribution."""
    return bf(np.random.default_rng().standard_normal(shape) * scale)


async def test_every_bfloat16_uploads_and_reads_back_exactly(gpu: gpud_client.Client) -> None:
    values = bits_to_float32(EVERY)
    t = gpu.tensor(values, dtype="bfloat16")
    assert t.dtype == bfloat16 and t.dtype == "bfloat16" and t.nbytes == 2 * 0x10000
    nan = np.isnan(values)
    got = bits_of(await t.numpy())
    np.testing.assert_array_equal(got[~nan], EVERY[~nan])
    np.testing.assert_array_equal(got[nan], (EVERY[nan] & 0x8000) | 0x7FC0)  # the quiet NaN of its sign
    odd = gpu.empty((3,), "bfloat16")
    odd.upload(np.array([1.0, -2.5, 3.0], np.float32))  # float32 rounded to nearest even
    np.testing.assert_array_equal(await odd.numpy(), [1.0, -2.5, 3.0])
    a = rand((5, 7, 3))
    x = gpu.tensor(a, dtype=bfloat16)
    np.testing.assert_array_equal(await x.transpose(0, 2).numpy(), a.transpose(2, 1, 0))
    np.testing.assert_array_equal(await x.narrow(1, 2, 3).numpy(), a[:, 2:5])
    np.testing.assert_array_equal(await gpu.empty((2, 3), "bfloat16").numpy(), np.zeros((2, 3), np.float32))


async def test_uploads_take_float32_or_bfloat16_and_say_what_else(gpu: gpud_client.Client) -> None:
    t = gpu.empty((4,), "bfloat16")
    with pytest.raises(InvalidArgument, match="is bfloat16, got float64: give float32 values"):
        t.upload(np.ones(4))
    with pytest.raises(InvalidArgument, match="does not match"):
        t.upload(np.ones(5, np.float32))
    halves = np.array([1.0, 2.0**-10, 65504.0, -0.0], np.float16)
    np.testing.assert_array_equal(await gpu.tensor(halves, dtype="bfloat16").numpy(), bf(halves))
    doubles = np.array([1.0 + 2.0**-8 + 2.0**-30, 1e300, -3.0])  # rounded once: not to 1.0, but up
    np.testing.assert_array_equal(await gpu.tensor(doubles, dtype="bfloat16").numpy(), [1.0 + 2.0**-7, np.inf, -3.0])


async def test_ml_dtypes_arrays_upload_as_they_are(gpu: gpud_client.Client) -> None:
    ml_dtypes = pytest.importorskip("ml_dtypes")
    theirs = np.array([1.5, -0.0, np.inf, 3.0e38], ml_dtypes.bfloat16)
    t = gpu.tensor(theirs)
    assert t.dtype == bfloat16 and t.dtype == theirs.dtype
    np.testing.assert_array_equal(bits_of(await t.numpy()), theirs.view(np.uint16))
    t.upload(theirs[::-1].copy())
    np.testing.assert_array_equal(bits_of(await t.numpy()), theirs[::-1].view(np.uint16))


async def test_casts_to_and_from_bfloat16_are_exact(gpu: gpud_client.Client) -> None:
    rng = np.random.default_rng()
    edge = np.array([0x00000001, 0x00008000, 0x00018000, 0x00007FFF, 0x3F808000, 0x3F818000, 0x3F807FFF,
                     0x7F7F7FFF, 0x7F7F8000, 0xFF7F8000, 0x7F800000, 0xFF800000, 0x7FC00000, 0xFF800001,
                     0x80000000, 0x007FFFFF, 0x00800000], np.uint32)  # fmt: skip
    patterns = np.concatenate([edge, rng.integers(0, 2**32, 50_001, dtype=np.uint64).astype(np.uint32)])
    f32 = patterns.view(np.float32)
    down = gpu.ops.cast(gpu.tensor(f32), "bfloat16", out=poisoned(gpu, f32.shape))
    np.testing.assert_array_equal(bits_of(await down.numpy()), float32_to_bits(f32))
    up = gpu.ops.cast(gpu.tensor(bits_to_float32(EVERY), dtype="bfloat16"), "float32")
    want = bits_to_float32(EVERY).view(np.uint32)
    want = np.where(np.isnan(bits_to_float32(EVERY)), (want & 0x80000000) | 0x7FC00000, want)  # uploaded quiet
    np.testing.assert_array_equal((await up.numpy()).view(np.uint32), want)
    finite = bf(rng.standard_normal(1001) * 10.0 ** rng.integers(-9, 6, 1001))
    halves = gpu.ops.cast(gpu.tensor(finite, dtype="bfloat16"), "float16", out=poisoned(gpu, finite.shape, "float16"))
    with np.errstate(over="ignore"):
        np.testing.assert_array_equal(await halves.numpy(), finite.astype(np.float16))
    back = gpu.ops.cast(halves, "bfloat16", out=poisoned(gpu, finite.shape))
    np.testing.assert_array_equal(await back.numpy(), bf((await halves.numpy()).astype(np.float32)))


@pytest.mark.parametrize("dtype", ["int8", "uint8", "int16", "int32", "uint32", "int64", "uint64"])
async def test_casts_between_bfloat16_and_integers(gpu: gpud_client.Client, dtype: str) -> None:
    info = np.iinfo(dtype)
    rng = np.random.default_rng()
    ints = rng.integers(max(info.min, -(2**62)), min(info.max, 2**62), 1001, dtype=np.int64, endpoint=True)
    ints[:2] = max(info.min, -(2**62)), min(info.max, 2**62)
    a = ints.astype(dtype)
    got = await gpu.ops.cast(gpu.tensor(a), "bfloat16").numpy()  # through float32, as torch and ml_dtypes
    np.testing.assert_array_equal(got, bf(a.astype(np.float32)))
    small = bf(rng.integers(0 if info.min == 0 else -100, 101, 1001) + rng.choice([0.0, 0.25, 0.5, 0.75], 1001))
    np.testing.assert_array_equal(await gpu.ops.cast(gpu.tensor(small, dtype="bfloat16"), dtype).numpy(),
                                  np.trunc(small).astype(dtype))  # fmt: skip
    wide = np.array([np.nan, np.inf, -np.inf, 3e38, -3e38], np.float32)  # saturated, NaN to 0
    got = await gpu.ops.cast(gpu.tensor(wide, dtype="bfloat16"), dtype).numpy()
    np.testing.assert_array_equal(got, np.array([0, info.max, info.min, info.max, info.min], dtype))


@pytest.mark.parametrize("op", ["add", "sub", "mul", "maximum", "minimum"])
async def test_exact_binary_ops_broadcast_and_mix(gpu: gpud_client.Client, op: str) -> None:
    fn = getattr(np, {"sub": "subtract", "mul": "multiply"}.get(op, op))
    for xs, ys in [((7,), (7,)), ((3, 5, 257), (257,)), ((4, 1, 3), (1, 5, 1))]:
        a, b = rand(xs, 4.0), rand(ys, 4.0)
        x, y = gpu.tensor(a, dtype="bfloat16"), gpu.tensor(b, dtype="bfloat16")
        shape = np.broadcast_shapes(xs, ys)
        out = poisoned(gpu, shape)
        assert getattr(gpu.ops, op)(x, y, out=out) is out
        np.testing.assert_array_equal(await out.numpy(), bf(fn(a, b)))  # float32 arithmetic, rounded once
        mixed = getattr(gpu.ops, op)(x, gpu.tensor(b.astype(np.float16)))  # bfloat16 with float16: float32
        assert mixed.dtype == np.float32
        np.testing.assert_array_equal(await mixed.numpy(), fn(a, b.astype(np.float16).astype(np.float32)))
    c = rand((5, 7), 4.0)
    cond = gpu.tensor((c > 0).astype(np.uint8))
    where = gpu.ops.where(cond, gpu.tensor(c, dtype="bfloat16"), gpu.tensor(-c, dtype="bfloat16"))
    assert where.dtype == bfloat16
    np.testing.assert_array_equal(await where.numpy(), np.abs(c))


async def test_rounded_ops_are_within_one_rounding(gpu: gpud_client.Client) -> None:
    a = rand((3, 5, 257), 2.0)
    b = bf(np.abs(a[::-1]) + 0.5)  # positive
    x, y = gpu.tensor(a, dtype="bfloat16"), gpu.tensor(b, dtype="bfloat16")
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    silu = a64 / (1.0 + np.exp(-a64))
    cases = [
        (gpu.ops.div(x, y), a64 / b64),
        (gpu.ops.silu_mul(x, y), silu * b64),
        (gpu.ops.exp(x), np.exp(a64)),
        (gpu.ops.silu(x), silu),
        (gpu.ops.tanh(x), np.tanh(a64)),
        (gpu.ops.scale(x, 0.3), 0.3 * a64),
        (gpu.ops.clamp(x, -1.0, 0.5), np.clip(a64, -1.0, 0.5)),
        (gpu.ops.rsqrt(y), 1.0 / np.sqrt(b64)),
        (
            gpu.ops.add(gpu.tensor(a * np.float32(1.001)), gpu.tensor(b), out=poisoned(gpu, a.shape)),
            (a * np.float32(1.001)).astype(np.float64) + b,
        ),  # float32 in, bfloat16 out
    ]
    for i, (tensor, ref) in enumerate(cases):
        assert tensor.dtype == bfloat16
        got = (await tensor.numpy()).astype(np.float64)
        assert not np.isnan(got).any(), i
        err = np.abs(got - ref) / (np.abs(ref) + 1e-6)  # bfloat16's unit roundoff is 2^-8
        assert np.all(err <= 2.0**-8 * 1.001), (i, np.max(err))


async def test_contiguous_moves_bfloat16_bits(gpu: gpud_client.Client) -> None:
    a = bits_to_float32(np.random.default_rng().integers(0, 0x7F80, (5, 7, 3)).astype(np.uint16))
    x = gpu.tensor(a, dtype="bfloat16")
    for view, want in [(x.transpose(0, 2), a.transpose(2, 1, 0)), (x.narrow(1, 1, 5), a[:, 1:6])]:
        got = gpu.ops.contiguous(view, out=poisoned(gpu, want.shape))
        np.testing.assert_array_equal(await got.numpy(), want)


async def test_replays_and_residents_keep_bfloat16(gpu: gpud_client.Client) -> None:
    g = gpu.graph("bf16-step")
    h = g.input("h", (3, 7), "bfloat16")
    c = g.bind("c", (3, 7), "bfloat16")
    g.output("y", gpu.ops.mul(h, c, graph=g))
    step = await g.build()
    a, b = rand((3, 7)), rand((3, 7))
    bound = gpu.tensor(b, dtype="bfloat16")
    out = await step.replay(h=a, c=bound)
    assert out["y"].dtype == np.float32
    np.testing.assert_array_equal(out["y"], bf(a * b))
    with pytest.raises(InvalidArgument, match="input 'h' is bfloat16, got float64"):
        await step.replay(h=a.astype(np.float64), c=bound)
    t = gpu.tensor(a, dtype="bfloat16")
    gpu.publish(t, "test-bf16-resident")
    opened = await gpu.open("test-bf16-resident")
    assert opened.dtype == bfloat16 and opened.nbytes == a.size * 2
    np.testing.assert_array_equal(await opened.numpy(), a)
    listed = [r for r in await gpu.residents("test-bf16-") if r.name == "test-bf16-resident"]
    assert listed[0].dtype == "bfloat16"
    gpu.unpublish("test-bf16-resident")
    opened.free()
    step.free()


async def test_matmul_and_attention_take_bfloat16_but_not_mixed_with_float16(gpu: gpud_client.Client) -> None:
    """Regression: matmul, nn.Linear and both attentions refused bfloat16 (cast to float16 first). They
    take it now (tests/ops/test_matmul_bf16.py, test_attention_bf16.py check the values); only float16
    with bfloat16 is refused, by name, as torch does."""
    w = gpu.tensor(rand((4, 4)), dtype="bfloat16")
    x = gpu.tensor(rand((2, 4)))
    assert gpu.ops.matmul(x, w).dtype == np.float32 and nn.Linear(gpu, w)(gpu.ops.cast(x, "bfloat16")).dtype == bfloat16
    with pytest.raises(InvalidArgument, match="matmul: x is float16 and w bfloat16") as e:
        gpu.ops.matmul(gpu.ops.cast(x, "float16"), w)
    assert e.value.op == "matmul"
    q = gpu.tensor(rand((1, 2, 2, 4)), dtype="bfloat16")
    assert gpu.ops.attention(q, q, q).dtype == bfloat16
    with pytest.raises(InvalidArgument, match="attention: q is float16 and k, v bfloat16") as e:
        gpu.ops.attention(gpu.ops.cast(q, "float16"), q, q)
    assert e.value.op == "attention"
    cache = gpu.empty((1, 8, 2, 4), "bfloat16")
    pos = gpu.tensor(np.zeros(1, np.int32))
    assert gpu.ops.attention_decode(gpu.tensor(rand((1, 2, 4))), cache, cache, pos).dtype == np.float32
    with pytest.raises(InvalidArgument, match="attention_decode: q is float16"):
        gpu.ops.attention_decode(gpu.tensor(rand((1, 2, 4)).astype(np.float16)), cache, cache, pos)
    await gpu.sync()
