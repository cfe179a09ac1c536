"""Integration tests of loading weights: `load_safetensors`, `open_prefix`, `residents`, and uploads
in parts, against a real daemon on every backend.

What is checked: every dtype loads exactly (BF16 as bfloat16, or converted), a tensor larger than one
chunk arrives whole; a hostile file is refused before anything is allocated, and a load that fails
half-way (a name taken) leaves nothing published or allocated; `open_prefix` and `residents` see
exactly what `open` would (published names only, in their publisher's mode), all or nothing, in one
round trip; a part upload is checked against its tensor.
"""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from safetensors_writer import bf16_bits, header_of, write, write_raw

import gpud_client
import gpud_protocol as proto
from gpud.testing import spawn
from gpud_client import AlreadyExists, Client, InvalidArgument, PermissionDenied
from gpud_client.dtypes import bits_to_float32, to_bits
from gpud_client.uploads import queue_part


def _prefix(what: str) -> str:
    """A prefix no other test uses (the daemon is shared by the whole session)."""
    return f"test/load-{what}-{uuid.uuid4().hex[:12]}/"


async def usage(gpu: Client) -> tuple[int, int]:
    """(private bytes, handles) of this session."""
    session = (await gpu.stats())["session"]
    return session["private_bytes"], session["handles"]


def checkpoint(tmp_path: Path) -> tuple[Path, dict[str, np.ndarray[Any, Any]]]:
    """A file of every dtype the tests load, and the float32/int32 values each should load as."""
    rng = np.random.default_rng(7)
    f32 = rng.standard_normal((5, 3)).astype(np.float32)
    f16 = rng.standard_normal(7).astype(np.float16)
    i32 = rng.integers(-(2**31), 2**31 - 1, (2, 2), dtype=np.int32)
    bf = bf16_bits(rng.standard_normal((3, 4)).astype(np.float32))
    big = rng.standard_normal((9, 11)).astype(np.float32)  # 396 bytes: many 64-byte chunks
    tensors = {"a.f32": f32, "a.f16": f16, "b.i32": i32, "b.bf16": ("BF16", bf), "c.big": big}
    path = write(tmp_path / "model.safetensors", tensors, metadata={"format": "pt"})
    bf32 = (bf.astype(np.uint32) << 16).view(np.float32)
    return path, {"a.f32": f32, "a.f16": f16, "b.i32": i32, "b.bf16": bf32, "c.big": big}


async def test_load_every_dtype_in_chunks_and_open_it_elsewhere(gpu: Client, address: str, tmp_path: Path) -> None:
    path, expected = checkpoint(tmp_path)
    prefix = _prefix("dtypes")
    tensors = await gpu.load_safetensors(path, prefix=prefix, chunk_bytes=64)
    assert set(tensors) == set(expected)
    for name, want in expected.items():
        got = await tensors[name].numpy()
        assert got.dtype == want.dtype and got.shape == want.shape, name
        np.testing.assert_array_equal(got, want)
    async with gpud_client.connect(address) as other:
        opened = await other.open_prefix(prefix)
        assert set(opened) == set(expected)
        for name, want in expected.items():
            assert opened[name].mode == "ro"
            np.testing.assert_array_equal(await opened[name].numpy(), want)
        listed = await other.residents(prefix)
        assert [r.name for r in listed] == sorted(prefix + name for name in expected)
        by_name = {r.name[len(prefix) :]: r for r in listed}
        for name, want in expected.items():
            dtype, nbytes = ("bfloat16", want.size * 2) if name == "b.bf16" else (want.dtype.name, want.nbytes)
            assert by_name[name] == gpud_client.Resident(prefix + name, dtype, want.shape, "ro", nbytes, gpu.device)
        assert tensors["b.bf16"].dtype == "bfloat16"  # BF16 loads as bfloat16; numpy() gives its float32 values
    for name in expected:
        gpu.unpublish(prefix + name)
        tensors[name].free()
    assert await gpu.residents(prefix) == []


async def test_dtype_converts_floats_and_keeps_integers(gpu: Client, tmp_path: Path) -> None:
    path, expected = checkpoint(tmp_path)
    prefix = _prefix("f16")
    tensors = await gpu.load_safetensors(path, prefix, dtype="float16", mode="rw", chunk_bytes=64)
    for name, want in expected.items():
        got = await tensors[name].numpy()
        if want.dtype.kind == "f":
            assert got.dtype == np.float16, name
            np.testing.assert_array_equal(got, want.astype(np.float16))
        else:
            assert got.dtype == want.dtype, name
            np.testing.assert_array_equal(got, want)
    assert {r.mode for r in await gpu.residents(prefix)} == {"rw"}
    for name in expected:
        gpu.unpublish(prefix + name)
        tensors[name].free()


async def test_dtype_bfloat16_loads_floats_rounded_to_nearest_even(gpu: Client, tmp_path: Path) -> None:
    path, expected = checkpoint(tmp_path)
    prefix = _prefix("bf16")
    tensors = await gpu.load_safetensors(path, prefix, dtype="bfloat16", chunk_bytes=64)
    for name, want in expected.items():
        got = await tensors[name].numpy()
        if want.dtype.kind == "f":
            assert tensors[name].dtype == "bfloat16", name
            np.testing.assert_array_equal(got, bits_to_float32(to_bits(want, name)))
        else:
            assert got.dtype == want.dtype, name
            np.testing.assert_array_equal(got, want)
    for name in expected:
        gpu.unpublish(prefix + name)
        tensors[name].free()


HOSTILE: list[tuple[str, dict[str, Any] | None, int | None, str]] = [
    ("bad offsets", {"dtype": "F32", "shape": [4], "data_offsets": [0, 64]}, None, "not inside"),
    ("huge header length", None, 2**40, "larger than"),
    ("unknown dtype", {"dtype": "F8_E5M2", "shape": [4], "data_offsets": [0, 4]}, None, "F8_E5M2"),
    ("span mismatch", {"dtype": "F32", "shape": [4], "data_offsets": [0, 8]}, None, "span 8"),
]


@pytest.mark.parametrize(("what", "bad", "length", "message"), HOSTILE, ids=[h[0] for h in HOSTILE])
async def test_hostile_file_is_refused_before_anything_is_made(
    gpu: Client, tmp_path: Path, what: str, bad: dict[str, Any] | None, length: int | None, message: str
) -> None:
    entries = {"ok": {"dtype": "U8", "shape": [16], "data_offsets": [0, 16]}}  # a valid tensor beside it
    if bad is not None:
        entries["bad"] = bad
    path = write_raw(tmp_path / "hostile.safetensors", header_of(entries), bytes(16), length)
    before = await usage(gpu)
    prefix = _prefix("hostile")
    with pytest.raises(InvalidArgument, match=message) as info:
        await gpu.load_safetensors(path, prefix)
    assert info.value.op == "load_safetensors" and str(path) in str(info.value)
    assert await usage(gpu) == before
    assert await gpu.residents(prefix) == []


async def test_a_name_gpud_refuses_is_refused_first(gpu: Client, tmp_path: Path) -> None:
    path = write(tmp_path / "names.safetensors", {"ok": np.zeros(2, np.float32), "bad name": np.zeros(1, np.uint8)})
    before = await usage(gpu)
    with pytest.raises(InvalidArgument, match="'bad name'"):
        await gpu.load_safetensors(path, _prefix("names"))
    with pytest.raises(InvalidArgument, match="is not a resident name"):
        await gpu.load_safetensors(write(tmp_path / "long.safetensors", {"x" * 120: np.zeros(1)}), "p" * 10)
    assert await usage(gpu) == before


async def test_a_load_failing_half_way_leaves_nothing(gpu: Client, address: str, tmp_path: Path) -> None:
    """A name is taken by another session: the load fails naming it, unpublishes what it published,
    frees what it made, and the other session's resident is untouched."""
    path, _ = checkpoint(tmp_path)
    prefix = _prefix("taken")
    async with gpud_client.connect(address) as other:
        theirs = other.tensor(np.array([42], np.int32))
        other.publish(theirs, prefix + "b.i32", "ro")
        await other.sync()
        before = await usage(gpu)
        with pytest.raises(AlreadyExists, match=r"b\.i32") as info:
            await gpu.load_safetensors(path, prefix, chunk_bytes=64)
        assert info.value.op == "load_safetensors"
        assert await usage(gpu) == before
        assert [r.name for r in await gpu.residents(prefix)] == [prefix + "b.i32"]
        await gpu.sync()  # nothing of the failed load is left to be reported
        np.testing.assert_array_equal(await (await gpu.open(prefix + "b.i32")).numpy(), [42])
        other.unpublish(prefix + "b.i32")
        theirs.free()
        await other.sync()


async def test_open_prefix_and_residents_see_what_open_would(gpu: Client, address: str) -> None:
    prefix = _prefix("perm")
    w = gpu.tensor(np.arange(6, dtype=np.float32).reshape(2, 3))
    kv = gpu.tensor(np.zeros(4, np.float16))
    private = gpu.tensor(np.ones(3, np.float32))  # never published: nobody else may see it
    gpu.publish(w, prefix + "w", "ro")
    gpu.publish(kv, prefix + "kv", "rw")
    gone = gpu.tensor(np.ones(2, np.float32))
    gpu.publish(gone, prefix + "gone", "ro")
    gpu.unpublish(prefix + "gone")  # a handle still holds it, the name is gone
    await gpu.sync()
    async with gpud_client.connect(address) as other:
        listed = await other.residents(prefix)
        assert [(r.name, r.mode, r.shape) for r in listed] == [
            (prefix + "kv", "rw", (4,)),
            (prefix + "w", "ro", (2, 3)),
        ]
        opened = await other.open_prefix(prefix)
        assert set(opened) == {"w", "kv"}
        assert (opened["w"].mode, opened["kv"].mode) == ("ro", "rw")
        assert opened["w"].shape == (2, 3) and opened["w"].dtype == np.float32
        np.testing.assert_array_equal(await opened["w"].numpy(), np.arange(6).reshape(2, 3))
        opened["kv"].upload(np.full(4, 2, np.float16))  # rw: writable, as open() would give it
        opened["w"].upload(np.zeros((2, 3), np.float32))  # ro: refused, as for open()
        with pytest.raises(PermissionDenied):
            await other.sync()
        np.testing.assert_array_equal(await w.numpy(), np.arange(6).reshape(2, 3))
        np.testing.assert_array_equal(await kv.numpy(), np.full(4, 2))
        with pytest.raises(PermissionDenied):
            other.ops.scale(opened["kv"], 2.0, out=opened["w"])
        assert await other.open_prefix(prefix + "nothing") == {}
        fresh = other.tensor(np.arange(3, dtype=np.float32))  # handles after open_prefix's stay distinct
        np.testing.assert_array_equal(await fresh.numpy(), np.arange(3))
    for name in ("w", "kv"):
        gpu.unpublish(prefix + name)
    for t in (w, kv, private, gone):
        t.free()
    assert await gpu.residents(prefix) == []


async def test_open_prefix_is_all_or_nothing_past_its_bound_and_residents_pages(gpu: Client) -> None:
    prefix = _prefix("many")
    count = proto.RESIDENTS_PER_REPLY + 1
    made = []
    for i in range(count):
        t = gpu.empty((1,), "uint8")
        gpu.publish(t, f"{prefix}{i:05d}", "ro")
        made.append(t)
    before = await usage(gpu)
    with pytest.raises(InvalidArgument, match=f"{count} resident tensors start with"):
        await gpu.open_prefix(prefix)
    assert await usage(gpu) == before  # nothing opened
    first = await gpu.residents(prefix)
    assert len(first) == proto.RESIDENTS_PER_REPLY
    rest = await gpu.residents(prefix, after=first[-1].name)
    assert [r.name for r in first + rest] == [f"{prefix}{i:05d}" for i in range(count)]
    assert len(await gpu.open_prefix(prefix + "0000")) == 10
    for i, t in enumerate(made):
        gpu.unpublish(f"{prefix}{i:05d}")
        t.free()
    assert await gpu.residents(prefix) == []


@pytest.mark.parametrize("bad", ["has space", "a" * 129, "é"])
async def test_bad_prefixes_are_refused_at_the_call(gpu: Client, bad: str) -> None:
    with pytest.raises(InvalidArgument) as info:
        await gpu.open_prefix(bad)
    assert info.value.seq is None and info.value.op == "open_prefix"
    with pytest.raises(InvalidArgument):
        await gpu.residents(bad)


async def test_part_uploads_are_checked_against_their_tensor(gpu: Client) -> None:
    data = np.arange(37, dtype=np.uint8)
    t = gpu.empty((37,), "uint8")
    for offset in range(0, 37, 8):
        queue_part(gpu, t, offset, data[offset : offset + 8].tobytes())
    np.testing.assert_array_equal(await t.numpy(), data)
    for offset, part, message in [
        (36, b"abcd", "reaches past"),
        (2, b"abcd", "multiple of 4"),
        (0, b"abc", "multiple"),
    ]:
        queue_part(gpu, t, offset, part)
        with pytest.raises(InvalidArgument, match=message) as info:
            await gpu.sync()
        assert info.value.op == "upload_part"
    np.testing.assert_array_equal(await t.numpy(), data)  # nothing written by the refused parts
    t.free()


async def test_a_tensor_larger_than_a_message_uploads_in_parts(tmp_path: Path) -> None:
    """A daemon whose messages carry at most 68 KiB: a 120 KB tensor still uploads, in parts."""
    config = tmp_path / "gpud.toml"
    config.write_text("[gpud.limits]\nmax_header_bytes = 65536\nmax_message_bytes = 69632\n")
    with spawn.daemon("fake", extra_args=("--config", str(config))) as (address, _proc):
        async with gpud_client.connect(address) as gpu:
            assert gpu.limits.max_message_bytes == 69632
            data = np.random.default_rng(1).standard_normal(30_001).astype(np.float32)  # 120 KB
            t = gpu.tensor(data)
            np.testing.assert_array_equal(await t.numpy(), data)
            path, expected = checkpoint(tmp_path)
            loaded = await gpu.load_safetensors(path, "m/")  # chunk_bytes bounded by the message: still loads
            np.testing.assert_array_equal(await loaded["c.big"].numpy(), expected["c.big"])


async def test_a_load_past_the_quota_fails_naming_the_tensor_and_leaves_nothing(tmp_path: Path) -> None:
    """The third tensor does not fit the session's quota: its alloc fails and so does each of its
    parts; every failure is read by the load itself (the session's next request is clean)."""
    tensors = {f"t{i}": np.full(100, i, np.float32) for i in range(4)}  # 400 bytes each
    path = write(tmp_path / "quota.safetensors", tensors)
    with spawn.daemon("fake", extra_args=("--session-memory-bytes", "1000")) as (address, _proc):
        async with gpud_client.connect(address) as gpu:
            before = await usage(gpu)
            with pytest.raises(gpud_client.OutOfMemory, match="tensor 't2'") as info:
                await gpu.load_safetensors(path, "q/", chunk_bytes=16)
            assert info.value.op == "load_safetensors"
            await gpu.sync()  # nothing of the load left to report
            assert await usage(gpu) == before
            assert await gpu.residents() == []
            loaded = await gpu.load_safetensors(write(tmp_path / "fits.safetensors", {"t": tensors["t1"]}), "q/")
            np.testing.assert_array_equal(await loaded["t"].numpy(), tensors["t1"])
