"""What an op says of an operand that is no tensor of gpud's: a numpy array (host memory), or a number
where the op takes none (the elementwise ops take numbers: gpud_client.ops.constants). Found where a
tensor's dtype or geometry is first read; the message names the op the user called and the argument,
found on the call stack (the error path alone pays for that)."""

from __future__ import annotations

import sys
from types import FrameType
from typing import Any

import numpy as np

from gpud_client.errors import InvalidArgument

_HOST = (np.ndarray, np.generic)


def foreign(value: Any) -> bool:
    """Is `value` no tensor of gpud's (a number, a numpy array: host values)?"""
    return not hasattr(value, "shape") or isinstance(value, _HOST)


def not_a_tensor(value: Any) -> InvalidArgument:
    """The error for `value`, an operand that is no tensor, naming the op and the argument it was."""
    op, name = _caller(value)
    what = name or "an operand"
    if isinstance(value, np.ndarray):
        why = f"{what} is a numpy array (host memory), not a tensor: upload it with gpu.tensor(...) first"
    elif isinstance(value, int) and not -(2**1024) < value < 2**1024:
        why = f"{what} is an integer of {value.bit_length()} bits, past every float dtype"
    elif isinstance(value, int | float | bool | np.generic):
        number = value.item() if isinstance(value, np.generic) else value
        why = (
            f"{what} is the number {number!r}, not a tensor: this op takes tensors there (a 0-d one: "
            f"gpu.tensor(np.float32({number!r})))"
        )
    else:
        why = f"{what} is {type(value).__name__}, not a tensor"
    return InvalidArgument(why, op=op)


def _caller(value: Any) -> tuple[str | None, str | None]:
    """(the public op method on the stack that was given `value`, the parameter it was given as)."""
    frame: FrameType | None = sys._getframe(2)
    while frame is not None:
        owner = frame.f_locals.get("self")
        code = frame.f_code.co_name
        if owner is not None and code[:1] != "_" and type(owner).__module__ == "gpud_client.ops":  # gpu.ops
            names = [k for k, v in frame.f_locals.items() if v is value and k != "self"]
            return code, (names[0] if names else None)
        frame = frame.f_back
    return None, None
