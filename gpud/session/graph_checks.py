"""Graph steps that name one buffer twice where the device would refuse it, found before encoding.

WebGPU refuses a copy whose source and destination are one buffer, whatever the ranges, and a
dispatch that binds one buffer read-only and read-write. It says so only when the command buffer is
finished, and then refuses the whole submission, other sessions' work in it included. So every step
is checked here first: at build with what the recording names (session tensors, intermediates,
views, the inputs, which share one packed buffer, bound names), and again at replay, once the bound
tensors are known. The same rule holds on every backend, so a graph that builds on one builds on all.

A memory key names an allocation: at build `build_key` (symbolic for the graph's own memory), at
replay `memory_key` of the resolved buffer.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence

from gpud.backends.base import Buffer, Program, memory_key
from gpud_protocol import ArgKind
from gpud_protocol.errors import InvalidArgument


def build_key(kind: int, value: int, fixed: Callable[[int], Buffer]) -> Hashable:
    """The memory a recording's (non-view) reference names, as far as the build can tell."""
    if kind == ArgKind.TENSOR:
        return ("buffer", memory_key(fixed(value)))
    if kind == ArgKind.INPUT:
        return ("inputs",)  # one packed buffer holds them all
    return (int(kind), value)  # an intermediate (a buffer each) or a bound name (known at replay)


def check_copy(number: int, src: Hashable, dst: Hashable, names: tuple[str, str]) -> None:
    if src == dst:
        what = names[0] if names[0] == names[1] else f"{names[0]} and {names[1]}"
        raise InvalidArgument(
            f"copy step {number}: source and destination are the same memory ({what}); WebGPU refuses a "
            "copy within one buffer: copy through an intermediate"
        )


def check_dispatch(number: int, program: Program, keys: Sequence[Hashable], names: Sequence[str]) -> None:
    """Tensor arguments `keys` (in order) of one dispatch: none may be one buffer in two accesses."""
    access = program.access
    if access is None or len(set(keys)) == len(keys):
        return
    first: dict[Hashable, int] = {}
    for position, key in enumerate(keys):
        earlier = first.setdefault(key, position)
        if earlier != position and position < len(access) and access[earlier] != access[position]:
            raise InvalidArgument(
                f"dispatch step {number} ({program.entry}): tensor arguments {earlier} and {position} are the "
                f"same memory ({names[earlier]} and {names[position]}), bound {access[earlier]} and "
                f"{access[position]}, which WebGPU refuses: pass a copy"
            )
