"""A tiny safetensors writer for the tests: well-formed files from arrays, and files broken on purpose."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

CODES = {
    "float64": "F64",
    "float32": "F32",
    "float16": "F16",
    "int64": "I64",
    "int32": "I32",
    "int16": "I16",
    "int8": "I8",
    "uint8": "U8",
    "uint16": "U16",
    "uint32": "U32",
    "uint64": "U64",
}


def bf16_bits(values: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
    """bfloat16 bit patterns of float32 `values` (truncated: exact for values that fit bf16)."""
    return (np.asarray(values, np.float32).view(np.uint32) >> 16).astype(np.uint16)


def write(path: Path, tensors: dict[str, Any], metadata: dict[str, str] | None = None) -> Path:
    """`tensors`: name -> array (its dtype's code), or (code, array) to store bit patterns (e.g.
    ("BF16", uint16 bits)). The data is laid out in order, as safetensors does."""
    header: dict[str, Any] = {} if metadata is None else {"__metadata__": metadata}
    blobs = []
    offset = 0
    for name, value in tensors.items():
        code, array = value if isinstance(value, tuple) else (CODES[np.asarray(value).dtype.name], value)
        data = np.ascontiguousarray(array).astype(np.asarray(array).dtype.newbyteorder("<")).tobytes()
        header[name] = {"dtype": code, "shape": list(np.shape(array)), "data_offsets": [offset, offset + len(data)]}
        blobs.append(data)
        offset += len(data)
    return write_raw(path, json.dumps(header).encode(), b"".join(blobs))


def write_raw(path: Path, header: bytes, data: bytes = b"", length: int | None = None) -> Path:
    """A file of the header length (`length`, default the header's), the header bytes and `data`."""
    size = len(header) if length is None else length
    path.write_bytes(size.to_bytes(8, "little") + header + data)
    return path


def header_of(entries: dict[str, Any]) -> bytes:
    return json.dumps(entries).encode()
