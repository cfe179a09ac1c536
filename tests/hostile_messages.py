"""test_hostile's generators for graph copy steps, UploadPart, OpenPrefix and ListResidents (issue 14 §2).

Graph builds whose copy step names one buffer twice, and builds that recorded an upload before an
invalid step, must be refused (the build keeps nothing: the final baseline check); a graph of two
bound tensors and a fixed one (`setup`) must refuse replays that bind one tensor twice or bind the
fixed tensor. Upload parts that reach past their tensor, start off 4 bytes, or go into another
session's tensor or a read-only resident are refused; prefixes that are too long, of bad
characters, or that match more residents than one reply holds (`mass_residents`) are refused too.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from hostile_library import INVALID, NOT_FOUND, PERMISSION, TENSOR, Expectations, Lib

from gpud_protocol import ArgKind, Opcode
from gpud_protocol.schema import RESIDENTS_PER_REPLY

INPUT, BIND, TEMP, VIEW = (int(k) for k in (ArgKind.INPUT, ArgKind.BIND, ArgKind.TEMP, ArgKind.VIEW))
M = 64  # elements of the copy graph's tensors
SAME = "same memory"
MASS = RESIDENTS_PER_REPLY + 76  # residents under one prefix: more than one open_prefix opens


def copy_graph_def(fixed: int) -> dict[str, Any]:
    """a -> b, then a -> fixed (a session tensor); outputs b."""
    return {
        "binds": [["a", "float32", [M]], ["b", "float32", [M]]],
        "steps": [[1, [BIND, 0], [BIND, 1]], [1, [BIND, 0], [TENSOR, fixed]]],
        "outputs": [["b", [BIND, 1]]],
    }


def setup(t: Any, b: Any, e: Expectations, lib: Lib) -> None:
    """The copy graph, on three tensors of this session's own (kept off the other generators)."""
    lib_tensors = [t.alloc(b, "float32", (M,)) for _ in range(3)]
    for h in lib_tensors:
        t.tensors[h].published = True
    t.copy_tensors = lib_tensors  # a, b, fixed
    handle = t.new_handle()

    def built(sent: Any, failed: bool) -> None:
        if not failed and sent.reply is not None and type(sent.reply.get("handle")) is int:
            t.copy_graph = sent.reply["handle"]

    b.op(Opcode.GRAPH, [handle, "copies", copy_graph_def(lib_tensors[2])], e.ok("graph", "the copy graph"), then=built)


def graph_copies(t: Any, b: Any, e: Expectations) -> None:
    rng = t.rng
    kind = rng.randrange(9)
    lib: Lib = t.lib
    if kind < 6 and lib.x:
        x = lib.x
        temps = [["float32", [M]], ["float32", [4]], ["float32", [8]]]
        cases: list[tuple[dict[str, Any], str, str]] = [
            ({"steps": [[1, [TENSOR, x], [TENSOR, x]]]}, "a tensor onto itself", SAME),
            (
                {"temps": temps, "views": [[[TEMP, 0], [M]]], "steps": [[1, [TEMP, 0], [VIEW, 0]]]},
                "a temporary onto a view of itself",
                SAME,
            ),
            (
                {"inputs": [["a", "float32", [M]], ["b", "float32", [M]]], "steps": [[1, [INPUT, 0], [INPUT, 1]]]},
                "input 0 onto input 1 (one buffer)",
                SAME,
            ),
            (
                {
                    "binds": [["b", "float32", [M]]],
                    "views": [[[BIND, 0], [8, 8]]],
                    "steps": [[1, [VIEW, 0], [VIEW, 0]]],
                },
                "a bound tensor's view onto itself",
                SAME,
            ),
            (
                {"views": [[[TENSOR, x], [16, 16]], [[TENSOR, x], [16, 16]]], "steps": [[1, [VIEW, 0], [VIEW, 1]]]},
                "two views of one tensor",
                SAME,
            ),
        ]
        if kind < len(cases):
            definition, what, names = cases[kind]
        else:  # a recorded upload, then an invalid step: the build keeps nothing (its buffer neither)
            size = rng.choice([M * 4, 1 << 18])
            frame = b.frame(t.rng.randbytes(size))
            definition = {
                "temps": [["float32", [size // 4]], ["float32", [4]], ["float32", [8]]],
                "steps": [[2, frame, [TEMP, 0]], [1, [TEMP, 1], [TEMP, 2]]],
            }
            what, names = f"a recorded upload of {size} bytes, then a copy of another shape", "graph step 1"
        b.op(
            Opcode.GRAPH,
            [t.new_handle(), f"bad{t.new_seq()}", definition],
            e.fails("graph", what, INVALID, names=names),
        )
        return
    graph = getattr(t, "copy_graph", None)
    if graph is None:
        return
    a, bb, fixed = t.copy_tensors
    op = Opcode.REPLAY if rng.random() < 0.5 else Opcode.LAUNCH
    name = "replay" if op == Opcode.REPLAY else "launch"
    if kind == 6:  # valid: a -> b, a -> fixed
        b.op(op, [graph, -1, [], [], [a, bb]], e.ok(name, "the copy graph"))
        t.tensors[bb].data = t.tensors[fixed].data = t.tensors[a].data
        return
    binds, what = rng.choice(
        [
            ([a, a], "two bound names given one tensor"),
            ([a, [a, 0, [M], [1]]], "two bound names given a tensor and its view"),
            ([fixed, bb], "a bound tensor onto the fixed tensor it is bound to"),
            ([[fixed, 0, [M], [1]], bb], "a view of the fixed tensor bound"),
        ]
    )
    b.op(op, [graph, -1, [], [], binds], e.fails(name, what, INVALID, names=SAME))


# ---------------------------------------------------------------------------- new messages


def upload_parts(t: Any, b: Any, e: Expectations) -> None:
    rng = t.rng
    lib: Lib = t.lib
    if not lib.out:
        return
    out = lib.out
    size = t.tensors[out].nbytes
    kind = rng.randrange(10)
    codes: tuple[int, ...] = (INVALID,)
    handle: Any = out
    offset, nbytes, frame_bytes = 0, 4, 4
    if kind == 0:  # valid: a part in the middle
        offset, nbytes = 4 * rng.randrange(size // 4 - 16), 64
        data = rng.randbytes(nbytes)
        b.op(Opcode.UPLOAD_PART, [out, b.frame(data), offset, nbytes], e.ok("upload_part", "a part inside"))
        before = t.tensors[out].data
        t.tensors[out].data = None if before is None else before[:offset] + data + before[offset + nbytes :]
        return
    if kind == 1:
        past: list[tuple[int, int]] = [(size, 4), (size - 4, 8), (size + 4, 4), (2**40, 4)]
        (offset, nbytes), what = rng.choice(past), "past the tensor"
        frame_bytes = nbytes
    elif kind == 2:
        unaligned: list[tuple[int, int]] = [(2, 4), (1, 4), (0, 6), (4, 3)]
        (offset, nbytes), what = rng.choice(unaligned), "unaligned"
        frame_bytes = nbytes
    elif kind == 3:
        handle, what, codes = t.run.foreign_handle(t.index, rng), "into another session's tensor", (NOT_FOUND,)
    elif kind == 4:
        handle, what, codes = t.stale_handle(), "into a stale handle", (NOT_FOUND,)
    elif kind == 5 and t.opened:
        handle, what, codes = rng.choice(list(t.opened)), "into a read-only resident", (PERMISSION,)
    elif kind == 6:
        handle, what = [out, 0, [4], [1]], "into a view"
    elif kind == 7:
        frame_bytes, what = 8, "a frame larger than nbytes"
    elif kind == 8:
        offset, what = rng.choice([-4, 2**63 - 1, 4.0, None]), "a bad offset"
    else:
        nbytes, frame_bytes, what = -4, 4, "negative nbytes"
    frame = b.frame(rng.randbytes(frame_bytes))
    b.op(Opcode.UPLOAD_PART, [handle, frame, offset, nbytes], e.fails("upload_part", what, *codes))


BAD_PREFIXES = ["a" * 129, "x" * 10_000, "bad prefix!", "\u00e9", "a\x00", "*", "semi;colon", 7, None, ["a"]]


def prefixes(t: Any, b: Any, e: Expectations) -> None:
    rng = t.rng
    kind = rng.randrange(6)
    if kind == 0:
        bad = rng.choice(BAD_PREFIXES)
        b.op(
            Opcode.OPEN_PREFIX,
            [t.new_handle(), bad],
            e.fails("open_prefix", f"a bad prefix {str(bad)[:12]!r}", INVALID),
        )
    elif kind == 1:
        bad = rng.choice(BAD_PREFIXES)
        fields = [bad, ""] if rng.random() < 0.5 else ["hostile", bad]
        b.op(Opcode.RESIDENTS, fields, e.fails("residents", f"a bad prefix or after {str(bad)[:12]!r}", INVALID))
    elif kind == 2:
        nothing = f"hostile.nothing/{t.new_seq()}"
        b.op(Opcode.OPEN_PREFIX, [t.new_handle(), nothing], e.ok("open_prefix", "a prefix of nothing"))
        b.op(Opcode.RESIDENTS, [nothing, ""], e.ok("residents", "a prefix of nothing"))
    elif kind == 3 and not t.leaving and (ro := [name for name, mode in t.names.items() if mode == "ro"]) and t.tensors:
        # This life's read-only name into a handle in use. (Not its read-write one too: another session
        # may unpublish that at any time, and then the range of handles asked for shrinks. Handles past
        # max_handle: tests/session/test_open_prefix.py.)
        in_use = rng.choice(list(t.tensors))
        b.op(Opcode.OPEN_PREFIX, [in_use, ro[0]], e.fails("open_prefix", "a handle in use", INVALID))
    elif kind == 4:
        b.op(Opcode.RESIDENTS, ["", rng.choice(["", "hostile", "zzzz"])], e.ok("residents", "every resident"))
    else:
        b.op(Opcode.RESIDENTS, ["hostile", "hostile.zzzz"], e.ok("residents", "after every name"))


async def mass_residents(t: Any, builder: Callable[[], Any], e: Expectations, seed: int) -> None:
    """MASS residents under one prefix: open_prefix refuses them all, residents lists them in pages."""
    prefix = f"hostile.{seed}/mass/"
    names = [f"{prefix}{i:05d}" for i in range(MASS)]
    b = builder()
    handles = []
    for name in names:
        h = t.new_handle()
        b.op(Opcode.ALLOC, [h, "uint8", [4], 0], e.ok("alloc", "a mass resident"))
        b.op(Opcode.PUBLISH, [h, name, "ro"], e.ok("publish", "a mass resident"))
        handles.append(h)
    await t.send_batch(b, hostile=False)
    await t.settle()
    pages: list[Any] = []

    def page(sent: Any, failed: bool) -> None:
        if not failed and sent.reply is not None:
            pages.append(sent.reply)

    b = builder()
    b.op(
        Opcode.OPEN_PREFIX,
        [t.new_handle(), prefix],
        e.fails("open_prefix", f"{MASS} matches", INVALID, names=str(MASS)),
    )
    b.op(Opcode.OPEN_PREFIX, [t.new_handle(), prefix[:-1]], e.fails("open_prefix", f"{MASS} matches", INVALID))
    b.op(Opcode.RESIDENTS, [prefix, ""], e.ok("residents", "the first page"), then=page)
    b.op(Opcode.RESIDENTS, [prefix, names[RESIDENTS_PER_REPLY - 1]], e.ok("residents", "the second page"), then=page)
    await t.send_batch(b)
    await t.settle()
    listed = [r[0] for p in pages for r in (p.get("residents") or [])]
    if listed != names or any(p.get("total") != MASS for p in pages):
        t.findings.add("wrong data (isolation or integrity)", f"{t.name}: residents listed {len(listed)} of {MASS}")
    b = builder()
    for name, h in zip(names, handles, strict=True):
        b.op(Opcode.UNPUBLISH, [name], e.ok("unpublish", "a mass resident"))
        b.op(Opcode.FREE, [h], e.ok("free", "a mass resident"))
    await t.send_batch(b, hostile=False)
    await t.settle()
    t.run.all_names.difference_update(names)  # removed: the cleanup need not try them one by one
