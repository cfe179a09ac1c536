"""Host dtypes of tensors: numpy's, and bfloat16, which numpy lacks.

A bfloat16 is the top 16 bits of a float32. numpy has no such dtype, so a bfloat16 tensor's `dtype` is
`bfloat16` below, which compares equal to the name "bfloat16" (and to ml_dtypes' bfloat16, when that
package is installed: the client does not need it). On the host its values are float32:

- `gpu.tensor(a, dtype="bfloat16")` rounds `a` (any real numbers) to nearest even, once: float64
  values go through float32 rounded to odd, which then rounds to bfloat16 as float64 directly would
  (integers past 2^53 are rounded to float64 first);
- `tensor.upload(a)` and a replay's bfloat16 inputs take float32 arrays (rounded to nearest even) or
  ml_dtypes.bfloat16 arrays (as they are);
- `await tensor.numpy()` and a replay's bfloat16 outputs are float32 arrays (exact).

Rounding: infinities stay, a float32 past bfloat16's largest finite value by half an ulp or more
gives infinity, subnormals round like any value, and NaN gives the quiet NaN of its sign (0x7fc0,
0xffc0): ml_dtypes' rounding of float32, and the daemon's kernels (gpud/ops/elementwise.*) round the
same bits the same way. Of float64 (and integers), ml_dtypes and torch round to float32 first, which
differs from rounding once where float32 lands on a tie of bfloat16 (1 + 2^-8 + 2^-30 is 1 there,
1 + 2^-7 here).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from gpud_client.operands import not_a_tensor

NAME = "bfloat16"


class BFloat16:
    """The dtype of a bfloat16 tensor (numpy has none): `.name`, `.itemsize`, equal to "bfloat16"."""

    __slots__ = ()
    name = NAME
    itemsize = 2

    def __eq__(self, other: object) -> bool:
        return is_bfloat16(other)

    def __hash__(self) -> int:
        return hash(NAME)

    def __repr__(self) -> str:
        return "dtype('bfloat16')"

    def __str__(self) -> str:
        return NAME


bfloat16 = BFloat16()
HostDType = np.dtype[Any] | BFloat16


def is_bfloat16(spec: object) -> bool:
    """`spec` names bfloat16: the name, `bfloat16` above, or ml_dtypes' bfloat16 (type or dtype)."""
    if isinstance(spec, BFloat16):
        return True
    if isinstance(spec, str):
        return spec == NAME
    if isinstance(spec, np.dtype):
        return spec.name == NAME and spec.itemsize == 2
    if isinstance(spec, type) and spec.__name__ == NAME:
        try:
            return np.dtype(spec).name == NAME
        except TypeError:
            return False
    return False


# Every op reads its tensors' dtype names (numpy's `dtype.name` takes microseconds): the answers for the
# specs met so far (names, numpy dtypes and scalar types, `bfloat16`), which are few and immutable.
# Specs that compare equal name one dtype, so keys never mislead. Bounded: past it, no more are kept.
CACHED_SPECS = 256
_hosts: dict[Any, HostDType] = {}
_names: dict[Any, str] = {}


def _cacheable(spec: object) -> bool:
    return type(spec) is str or isinstance(spec, np.dtype | BFloat16 | type)


def host_dtype(spec: Any) -> HostDType:
    """The dtype `spec` names: numpy's, or `bfloat16` (TypeError when neither)."""
    try:
        return _hosts[spec]
    except (KeyError, TypeError):  # not met yet, or unhashable
        pass
    dtype: HostDType = bfloat16 if is_bfloat16(spec) else np.dtype(spec)
    if len(_hosts) < CACHED_SPECS and _cacheable(spec):
        _hosts[spec] = dtype
    return dtype


def name_of(dtype: Any) -> str:
    """The gpud name of a dtype (a tensor's `.dtype`, a numpy dtype, a name); what numpy cannot read
    as a dtype, as a string (for the error that names it)."""
    try:
        return _names[dtype]
    except (KeyError, TypeError):
        pass
    if is_bfloat16(dtype):
        name = NAME
    else:
        try:
            name = str(np.dtype(dtype).name)
        except TypeError:
            return str(dtype)
    if len(_names) < CACHED_SPECS and _cacheable(dtype):
        _names[dtype] = name
    return name


def storage_dtype(dtype: HostDType) -> np.dtype[Any]:
    """The numpy dtype of a tensor's stored elements: uint16 (the bits) for bfloat16."""
    return np.dtype(np.uint16) if isinstance(dtype, BFloat16) else dtype


def values_dtype(dtype: HostDType) -> np.dtype[Any]:
    """The numpy dtype of a tensor's values on the host: float32 for bfloat16."""
    return np.dtype(np.float32) if isinstance(dtype, BFloat16) else dtype


_BOOL = np.dtype(bool)


def from_storage(raw: np.ndarray[Any, Any], dtype: HostDType, copy: bool = False) -> np.ndarray[Any, Any]:
    """Elements stored as `dtype` (`raw`: their bytes, or an array of the storage dtype) as host values:
    a view of `raw` unless `copy` (bfloat16: always a new float32 array)."""
    stored = raw.view(storage_dtype(dtype))
    if isinstance(dtype, BFloat16):
        return bits_to_float32(stored)
    if dtype == _BOOL:  # any byte but 0 is True: a tensor another session wrote may hold 2, which numpy's bool must not
        flags: np.ndarray[Any, Any] = raw.view(np.uint8) != 0
        return flags
    return stored.copy() if copy else stored


def float32_to_bits(values: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
    """float32 values rounded to bfloat16 (nearest even), as uint16 bits."""
    x = np.ascontiguousarray(values, np.float32).view(np.uint32)
    rounded = (x + np.uint32(0x7FFF) + ((x >> np.uint32(16)) & np.uint32(1))) >> np.uint32(16)
    quiet = ((x >> np.uint32(16)) & np.uint32(0x8000)) | np.uint32(0x7FC0)
    nan = (x & np.uint32(0x7FFFFFFF)) > np.uint32(0x7F800000)
    return np.where(nan, quiet, rounded).astype(np.uint16)


def bits_to_float32(bits: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
    """bfloat16 bits (uint16) as float32 values: exact."""
    return (np.asarray(bits, np.uint16).astype(np.uint32) << np.uint32(16)).view(np.float32)


def _float32_rounded_to_odd(values: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
    """float64 values as float32 truncated toward zero, the lowest bit set where that was inexact
    (round to odd): rounding that to bfloat16 is rounding the float64 values to bfloat16 (float32
    carries more than two bits past bfloat16's, subnormals included)."""
    with np.errstate(over="ignore", invalid="ignore"):
        nearest = values.astype(np.float32)
        back = nearest.astype(np.float64)
    bits = nearest.view(np.uint32).copy()
    inexact = (back != values) & ~np.isnan(values)
    bits[inexact & (np.abs(back) > np.abs(values))] -= np.uint32(1)  # one step toward zero (inf: the largest finite)
    bits[inexact] |= np.uint32(1)
    return bits.view(np.float32)


def to_bits(array: Any, what: str) -> np.ndarray[Any, Any]:
    """Host values as bfloat16 bits (uint16, same shape), rounded once to nearest even; ValueError
    naming `what` for values that are not real numbers."""
    host = np.asarray(array, order="C")
    if is_bfloat16(host.dtype):
        return host.view(np.uint16)
    if host.dtype == np.float32:
        return float32_to_bits(host)
    if host.dtype == np.float16:
        return float32_to_bits(host.astype(np.float32))  # exact
    if host.dtype.kind not in "biuf":
        raise ValueError(f"{what}: {host.dtype} values cannot become bfloat16 (real numbers only)")
    return float32_to_bits(_float32_rounded_to_odd(host.astype(np.float64)))


def exact_bits(array: Any, what: str) -> np.ndarray[Any, Any]:
    """Data for a bfloat16 tensor's upload or a replay's bfloat16 input: a float32 array (rounded to
    nearest even) or an ml_dtypes.bfloat16 one, as bits; ValueError naming `what` otherwise."""
    host = np.asarray(array, order="C")
    if not (is_bfloat16(host.dtype) or host.dtype == np.float32):
        raise ValueError(
            f"{what} is bfloat16, got {host.dtype}: give float32 values (rounded to nearest even) or "
            "ml_dtypes.bfloat16 ones (np.asarray(value, np.float32))"
        )
    return to_bits(host, what)


def dtype_name(tensor: Any) -> str:
    """The gpud name of a tensor's dtype: its cached `dtype_name`, else its `.dtype`'s."""
    try:
        name: str = tensor.dtype_name
        return name
    except AttributeError:
        dtype = getattr(tensor, "dtype", None)
    if dtype is None:  # a Python number, a list: no tensor
        raise not_a_tensor(tensor)
    return name_of(dtype)


__all__ = [
    "NAME",
    "BFloat16",
    "HostDType",
    "bfloat16",
    "bits_to_float32",
    "dtype_name",
    "exact_bits",
    "float32_to_bits",
    "from_storage",
    "host_dtype",
    "is_bfloat16",
    "name_of",
    "storage_dtype",
    "to_bits",
    "values_dtype",
]
