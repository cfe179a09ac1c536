"""The safetensors reader (gpud_client.loaders.safetensors) on generated files: no daemon.

Well-formed files read back exactly (BF16 as its bfloat16 bits, or converted; chunk by chunk with
every chunk but the last a multiple of 4 bytes); a hostile header is refused with a message that says what is wrong,
before any data is read.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
from safetensors_writer import bf16_bits, header_of, write, write_raw

from gpud_client.dtypes import float32_to_bits, to_bits
from gpud_client.loaders.safetensors import MAX_HEADER_BYTES, STORED, FormatError, chunks, read_header


def host(dtype: str) -> np.dtype[Any]:
    """How a loaded dtype's bytes read on the host (bfloat16: its bits, uint16)."""
    return np.dtype(np.uint16) if dtype == "bfloat16" else np.dtype(dtype)


def load_all(path: Path, dtype: str | None = None, size: int = 1 << 20) -> dict[str, np.ndarray[Any, Any]]:
    """Every tensor of `path` as the loader would send it, reassembled from its chunks."""
    data = np.memmap(path, np.uint8, mode="r")
    out = {}
    for entry in read_header(path, 8):
        loaded = host(entry.loads_as(dtype))
        buffer = bytearray(entry.elements * loaded.itemsize)
        for offset, chunk in chunks(data, entry, entry.loads_as(dtype), size):
            buffer[offset : offset + len(chunk)] = chunk
        out[entry.name] = np.frombuffer(bytes(buffer), loaded).reshape(entry.shape)
    return out


def test_reads_every_dtype_back(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    arrays: dict[str, np.ndarray[Any, Any]] = {
        "f64": rng.standard_normal((3, 5)),
        "f32": rng.standard_normal((4, 7)).astype(np.float32),
        "f16": rng.standard_normal(9).astype(np.float16),
        "i64": rng.integers(-(2**40), 2**40, 6),
        "i32": rng.integers(-1000, 1000, (2, 3), dtype=np.int32),
        "i16": rng.integers(-1000, 1000, 5, dtype=np.int16),
        "i8": rng.integers(-100, 100, 7, dtype=np.int8),
        "u8": rng.integers(0, 255, 11, dtype=np.uint8),
        "u16": rng.integers(0, 60000, 3, dtype=np.uint16),
        "u32": rng.integers(0, 2**31, 3, dtype=np.uint32),
        "u64": rng.integers(0, 2**62, 3, dtype=np.uint64),
        "scalar": np.array(2.5, np.float32),
        "empty": np.zeros((0, 3), np.float32),
    }
    path = write(tmp_path / "all.safetensors", arrays, metadata={"format": "pt"})
    loaded = load_all(path)
    assert set(loaded) == set(arrays)
    for name, array in arrays.items():
        assert loaded[name].dtype == array.dtype and loaded[name].shape == array.shape, name
        np.testing.assert_array_equal(loaded[name], array)


def test_bf16_loads_as_its_bits_and_converts_exactly(tmp_path: Path) -> None:
    values = np.array(
        [0.0, -0.0, 1.0, -2.5, 3.140625, 2.0**-126, 2.0**-133, 65280.0, np.inf, -np.inf, 2.0**100], np.float32
    )
    bits = bf16_bits(values)
    path = write(tmp_path / "bf16.safetensors", {"w": ("BF16", bits), "b": ("BOOL", np.array([0, 1], np.uint8))})
    assert next(e for e in read_header(path, 8) if e.name == "w").loads_as(None) == "bfloat16"
    loaded = load_all(path)
    np.testing.assert_array_equal(loaded["w"], bits)  # the bits as the file holds them
    as_f32 = load_all(path, "float32")["w"]
    assert as_f32.dtype == np.float32
    np.testing.assert_array_equal(as_f32, values)  # each value is a bfloat16: exact
    nan = load_all(write(tmp_path / "nan.safetensors", {"w": ("BF16", np.array([0x7FC0], np.uint16))}), "float32")
    assert np.isnan(nan["w"]).all()
    assert loaded["b"].dtype == np.uint8 and loaded["b"].tolist() == [0, 1]  # no gpud bool


def test_dtype_converts_floating_tensors_only(tmp_path: Path) -> None:
    f32 = np.linspace(-3, 3, 10, dtype=np.float32)
    ints = np.arange(5, dtype=np.int32)
    path = write(tmp_path / "mix.safetensors", {"f": f32, "bf": ("BF16", bf16_bits(f32)), "i": ints})
    loaded = load_all(path, "float16")
    assert loaded["f"].dtype == np.float16 and loaded["bf"].dtype == np.float16
    np.testing.assert_array_equal(loaded["f"], f32.astype(np.float16))
    np.testing.assert_array_equal(
        loaded["bf"], (bf16_bits(f32).astype(np.uint32) << 16).view(np.float32).astype(np.float16)
    )
    assert loaded["i"].dtype == np.int32  # integer tensors keep their dtype


def test_dtype_bfloat16_rounds_each_float_once_to_nearest_even(tmp_path: Path) -> None:
    f64 = np.array([1.0 + 2.0**-8, 1.0 + 3 * 2.0**-9, 1.0 + 2.0**-9 + 2.0**-40, -7.3, 1e-30], np.float64)
    f32 = f64.astype(np.float32)
    f16 = np.array([1.0009765625, -3.5, 65504.0], np.float16)
    path = write(tmp_path / "to-bf16.safetensors", {"d": f64, "s": f32, "h": f16, "i": np.arange(3, dtype=np.int8)})
    loaded = load_all(path, "bfloat16")
    np.testing.assert_array_equal(loaded["d"], to_bits(f64, "d"))  # float64 rounded once, not through float32
    np.testing.assert_array_equal(loaded["s"], float32_to_bits(f32))  # nearest even (bf16_bits truncates)
    np.testing.assert_array_equal(loaded["h"], float32_to_bits(f16.astype(np.float32)))
    assert loaded["i"].dtype == np.int8


@pytest.mark.parametrize("size", [1, 4, 6, 8, 12, 64, 1000])
@pytest.mark.parametrize(
    ("array", "dtype"),
    [
        (np.arange(37, dtype=np.float32), None),
        (np.arange(37, dtype=np.float16), None),
        (np.arange(37, dtype=np.uint8), None),
        (np.arange(37, dtype=np.float16), "float32"),
        (np.arange(37, dtype=np.float64), "float16"),
        (np.arange(37, dtype=np.float32) / 7, "bfloat16"),
    ],
)
def test_chunks_cover_the_tensor_in_aligned_parts(tmp_path: Path, size: int, array: Any, dtype: str | None) -> None:
    path = write(tmp_path / "chunks.safetensors", {"pad": np.zeros(3, np.uint8), "x": array})
    entry = next(e for e in read_header(path, 8) if e.name == "x")
    loaded = entry.loads_as(dtype)
    parts = list(chunks(np.memmap(path, np.uint8, mode="r"), entry, loaded, size))
    total = entry.elements * host(loaded).itemsize
    assert [offset for offset, _ in parts] == sorted({offset for offset, _ in parts})
    assert sum(len(chunk) for _, chunk in parts) == total
    for offset, chunk in parts[:-1]:
        assert offset % 4 == 0 and len(chunk) % 4 == 0
    joined = np.frombuffer(b"".join(bytes(c) for _, c in parts), host(loaded))
    want = to_bits(array, "x") if loaded == "bfloat16" else array.astype(loaded)
    np.testing.assert_array_equal(joined, want)


def test_entries_come_in_data_order(tmp_path: Path) -> None:
    header = header_of(
        {
            "b": {"dtype": "U8", "shape": [2], "data_offsets": [2, 4]},
            "a": {"dtype": "U8", "shape": [2], "data_offsets": [0, 2]},
        }
    )
    entries = read_header(write_raw(tmp_path / "order.safetensors", header, b"\x01\x02\x03\x04"), 8)
    assert [e.name for e in entries] == ["a", "b"]


# --------------------------------------------------------------------------- hostile files

GOOD = {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}


def entry(**changes: Any) -> bytes:
    return header_of({"t": {**GOOD, **changes}})


HOSTILE: list[tuple[str, bytes, bytes, int | None, str]] = [
    ("too short", b"", b"", -1, "too short"),
    ("huge header length", b"{}", b"", 2**63, "larger than"),
    ("header past the end", b"{}", b"", 1000, "runs past the end"),
    ("not JSON", b"{not json", b"", None, "not valid JSON"),
    ("not UTF-8", b'{"\xff": 1}', b"", None, "not valid JSON"),
    ("deeply nested", b"[" * 100_000 + b"]" * 100_000, b"", None, "not valid JSON"),
    ("an array", b"[]", b"", None, "not an object"),
    ("a duplicate name", b'{"t": {}, "t": {}}', b"", None, "twice"),
    ("an entry not an object", header_of({"t": [1]}), b"", None, "not an object"),
    ("no dtype", header_of({"t": {"shape": [], "data_offsets": [0, 0]}}), b"", None, "no dtype"),
    ("an unknown dtype", entry(dtype="Q4_K"), bytes(8), None, "'Q4_K' is not one gpud loads"),
    ("float8", entry(dtype="F8_E4M3", shape=[8]), bytes(8), None, "'F8_E4M3' is not one gpud loads"),
    ("a negative dimension", entry(shape=[-2]), bytes(8), None, "non-negative integers"),
    ("a float dimension", entry(shape=[2.0]), bytes(8), None, "non-negative integers"),
    ("a bool dimension", entry(shape=[True, 2]), bytes(8), None, "non-negative integers"),
    ("a shape not a list", entry(shape=2), bytes(8), None, "non-negative integers"),
    ("too many dimensions", entry(shape=[1] * 8 + [2]), bytes(8), None, "9 dimensions, more than the 8"),
    ("offsets past the data", entry(data_offsets=[0, 16]), bytes(8), None, "not inside the 8 bytes"),
    ("offsets reversed", entry(data_offsets=[8, 0]), bytes(8), None, "not inside"),
    ("negative offsets", entry(data_offsets=[-8, 0]), bytes(8), None, "[begin, end]"),
    ("three offsets", entry(data_offsets=[0, 4, 8]), bytes(8), None, "[begin, end]"),
    ("span too short", entry(data_offsets=[0, 4]), bytes(8), None, "is 8 bytes, but data_offsets span 4"),
    ("span too long", entry(shape=[1]), bytes(8), None, "is 4 bytes, but data_offsets span 8"),
    ("a huge shape", entry(shape=[2**62, 2**62]), bytes(8), None, "data_offsets span 8"),
    ("an empty name", header_of({"": GOOD}), bytes(8), None, "empty name"),
]


@pytest.mark.parametrize(("what", "header", "data", "length", "message"), HOSTILE, ids=[h[0] for h in HOSTILE])
def test_hostile_headers_are_refused_clearly(
    tmp_path: Path, what: str, header: bytes, data: bytes, length: int | None, message: str
) -> None:
    path = tmp_path / "hostile.safetensors"
    if length == -1:
        path.write_bytes(b"\x01\x02\x03")
    else:
        write_raw(path, header, data, length)
    with pytest.raises(FormatError, match=message.replace("[", r"\[").replace("]", r"\]")):
        read_header(path, 8)


def test_the_header_bound_is_safetensors_own() -> None:
    assert MAX_HEADER_BYTES == 100_000_000


def test_every_loaded_dtype_is_a_gpud_dtype() -> None:
    import gpud_protocol

    for code, stored in STORED.items():
        assert stored.loads_as in gpud_protocol.DTYPE_SIZES, code
        assert np.dtype(stored.storage).itemsize == gpud_protocol.DTYPE_SIZES[stored.loads_as], code
