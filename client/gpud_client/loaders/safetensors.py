"""The safetensors format, read as hostile input.

A file is an 8-byte little-endian header length N, N bytes of JSON, then the data. The JSON maps
each tensor's name to {"dtype", "shape", "data_offsets": [begin, end]} (offsets into the data, which
starts after the header); "__metadata__" is ignored. Everything is checked before a byte of data is
read: a bounded header, offsets inside the file, shape x itemsize == the byte span, known dtypes.

`STORED` says how each dtype is stored and what gpud dtype it loads as: BF16 as bfloat16, its bits
unchanged. `dtype=` converts the floating-point tensors to float16, float32, float64 or bfloat16 (to
bfloat16 rounded once, to nearest even; from bfloat16 exactly to float32 and float64).
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Iterator
from typing import Any, BinaryIO, NamedTuple

import numpy as np

from gpud_client.dtypes import bits_to_float32, to_bits

MAX_HEADER_BYTES = 100_000_000  # safetensors' own bound on the JSON header


class FormatError(ValueError):
    """The file is not a safetensors file gpud can load; the message says what is wrong."""


class Stored(NamedTuple):
    storage: str  # numpy's name for the elements as the file holds them (little-endian)
    loads_as: str  # the gpud dtype of the tensor when no dtype= is given
    floating: bool  # converted by dtype=; integer tensors keep their dtype


STORED: dict[str, Stored] = {
    "F64": Stored("<f8", "float64", True),
    "F32": Stored("<f4", "float32", True),
    "F16": Stored("<f2", "float16", True),
    "BF16": Stored("<u2", "bfloat16", True),  # bfloat16 bits
    "I64": Stored("<i8", "int64", False),
    "I32": Stored("<i4", "int32", False),
    "I16": Stored("<i2", "int16", False),
    "I8": Stored("|i1", "int8", False),
    "U64": Stored("<u8", "uint64", False),
    "U32": Stored("<u4", "uint32", False),
    "U16": Stored("<u2", "uint16", False),
    "U8": Stored("|u1", "uint8", False),
    "BOOL": Stored("|u1", "uint8", False),  # no gpud bool: 0 and 1 as uint8
}
FLOAT_TARGETS = ("float16", "float32", "float64", "bfloat16")  # what dtype= may ask for


class Entry(NamedTuple):
    name: str
    dtype: str  # the file's ("F32", "BF16", ...)
    shape: tuple[int, ...]
    start: int  # absolute offset of the first byte in the file
    nbytes: int

    @property
    def stored(self) -> Stored:
        return STORED[self.dtype]

    @property
    def elements(self) -> int:
        """Elements."""
        return self.nbytes // np.dtype(self.stored.storage).itemsize

    def loads_as(self, dtype: str | None) -> str:
        """The gpud dtype this tensor gets with `dtype=` (None: its own)."""
        stored = self.stored
        return dtype if dtype is not None and stored.floating else stored.loads_as


def read_header(source: str | os.PathLike[str] | BinaryIO, max_ndim: int) -> list[Entry]:
    """The tensors of a safetensors file (a path, or a file open for reading in binary), checked, in
    the order of their data."""
    if isinstance(source, str | os.PathLike):
        with open(source, "rb") as opened:
            return read_header(opened, max_ndim)
    f = source
    size = f.seek(0, 2)
    if size < 8:
        raise FormatError(f"{size} bytes: too short for a safetensors file (an 8-byte header length first)")
    f.seek(0)
    length = int.from_bytes(f.read(8), "little")
    if length > MAX_HEADER_BYTES:
        raise FormatError(f"the header length {length} is larger than the {MAX_HEADER_BYTES} bytes allowed")
    if 8 + length > size:
        raise FormatError(f"the header length {length} runs past the end of the file ({size} bytes)")
    text = f.read(length)
    if len(text) != length:
        raise FormatError(f"the file ends inside its {length}-byte header")
    try:
        header = json.loads(text.decode("utf-8"), object_pairs_hook=_no_duplicates)
    except FormatError:
        raise
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise FormatError(f"the header is not valid JSON: {_short(exc)}") from None
    if not isinstance(header, dict):
        raise FormatError(f"the header is a JSON {type(header).__name__}, not an object")
    data_size = size - 8 - length
    entries = [
        _entry(name, info, 8 + length, data_size, max_ndim) for name, info in header.items() if name != "__metadata__"
    ]
    return sorted(entries, key=lambda e: e.start)


def _entry(name: str, info: Any, data_start: int, data_size: int, max_ndim: int) -> Entry:
    what = f"tensor {name[:80]!r}"
    if not name:
        raise FormatError("a tensor has an empty name")
    if not isinstance(info, dict):
        raise FormatError(f"{what}: its entry is not an object")
    dtype, shape, offsets = info.get("dtype"), info.get("shape"), info.get("data_offsets")
    if not isinstance(dtype, str):
        raise FormatError(f"{what}: no dtype string")
    if dtype not in STORED:
        raise FormatError(f"{what}: dtype {dtype[:20]!r} is not one gpud loads ({', '.join(STORED)})")
    if not isinstance(shape, list) or not all(_is_count(d) for d in shape):
        raise FormatError(f"{what}: the shape must be a list of non-negative integers")
    if len(shape) > max_ndim:
        raise FormatError(f"{what}: {len(shape)} dimensions, more than the {max_ndim} gpud allows")
    if not isinstance(offsets, list) or len(offsets) != 2 or not all(_is_count(o) for o in offsets):
        raise FormatError(f"{what}: data_offsets must be [begin, end], two non-negative integers")
    begin, end = offsets
    if not begin <= end <= data_size:
        raise FormatError(f"{what}: data_offsets [{begin}, {end}] are not inside the {data_size} bytes of data")
    itemsize = np.dtype(STORED[dtype].storage).itemsize
    nbytes = math.prod(shape) * itemsize
    if nbytes != end - begin:
        raise FormatError(f"{what}: shape {shape} of {dtype} is {nbytes} bytes, but data_offsets span {end - begin}")
    return Entry(name, dtype, tuple(shape), data_start + begin, nbytes)


def chunks(data: np.ndarray[Any, Any], entry: Entry, dtype: str, size: int) -> Iterator[tuple[int, memoryview]]:
    """(byte offset in the loaded tensor, bytes) of `entry` converted to `dtype`, about `size` bytes
    at a time: every chunk but the last is a multiple of 4 bytes. `data` is the file as uint8 (a map)."""
    storage = np.dtype(entry.stored.storage)
    from_bf16, to_bf16 = entry.dtype == "BF16", dtype == "bfloat16"
    out = np.dtype(np.uint16) if to_bf16 else np.dtype(dtype)  # bfloat16 travels as its bits
    count = entry.elements
    step = max(4, size // out.itemsize // 4 * 4)  # elements per chunk, a multiple of 4
    for first in range(0, count, step):
        n = min(step, count - first)
        at = entry.start + first * storage.itemsize
        values = data[at : at + n * storage.itemsize].view(storage)
        if values.size != n:
            raise FormatError(f"tensor {entry.name[:80]!r}: the file ends inside its data (did it change?)")
        if from_bf16 and not to_bf16:
            values = bits_to_float32(values)  # exact
        elif to_bf16 and not from_bf16:
            values = to_bits(values, f"tensor {entry.name[:80]!r}")  # rounded once, to nearest even
        # astype copies even when nothing converts: the bytes sent are ours, whatever happens to the file
        yield first * out.itemsize, values.astype(out).data.cast("B")


def _is_count(value: Any) -> bool:
    return type(value) is int and value >= 0


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    result = dict(pairs)
    if len(result) != len(pairs):
        seen: set[str] = set()
        twice = next(key for key, _ in pairs if key in seen or seen.add(key))  # type: ignore[func-returns-value]
        raise FormatError(f"the header names {twice[:80]!r} twice")
    return result


def _short(exc: BaseException) -> str:
    text = str(exc) or type(exc).__name__
    return text if len(text) <= 200 else text[:200] + "..."
