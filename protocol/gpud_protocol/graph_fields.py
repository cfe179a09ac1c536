"""The validator of a graph recording (`graph_def.GraphDef`) from a client: its tensors, scalars, views,
steps and outputs, each reference checked against what the graph declares."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from gpud_protocol.arg_kinds import Arg, ArgKind
from gpud_protocol.fields import (
    check_args,
    check_dtype,
    check_frame,
    check_grid,
    check_handle,
    check_name,
    check_shape,
    check_writes,
)
from gpud_protocol.graph_def import (
    GraphCopy,
    GraphDef,
    GraphDispatch,
    GraphOutput,
    GraphScalar,
    GraphTensor,
    GraphUpload,
)
from gpud_protocol.limits import Limits
from gpud_protocol.wire import bad, describe, is_int


def check_graph_tensor(value: Any, limits: Limits, what: str) -> GraphTensor:
    if type(value) is not tuple or len(value) != 3:
        raise bad(f"each graph {what} must be [name, dtype, shape], got {describe(value)}")
    name, dtype, shape = value
    return GraphTensor(check_name(name, limits, ()), check_dtype(dtype, limits, ()), check_shape(shape, limits, ()))


def check_graph_ref(value: Any, counts: dict[int, int], limits: Limits, scalars: bool = False) -> Arg:
    """A tensor of a graph recording (kind TENSOR, INPUT, BIND or TEMP), or with `scalars` any argument."""
    if type(value) is not tuple or len(value) != 2 or type(value[0]) is not int:
        raise bad(f"a graph reference must be [kind, value], got {describe(value)}")
    kind, v = value
    if kind == ArgKind.TENSOR:
        return (kind, check_handle(v, limits, ()))
    if kind in counts:
        if kind == ArgKind.SCALAR and not scalars:
            raise bad("a graph scalar is not a tensor")
        if not is_int(v) or not 0 <= v < counts[kind]:
            raise bad(f"graph reference [{kind}, {describe(v)}]: the graph has {counts[kind]} of that kind")
        return (kind, v)
    if scalars:
        return check_args((value,), limits, ())[0]  # type: ignore[return-value]  # not a TENSOR: handled above
    raise bad(f"bad graph tensor kind {describe(kind)}")


_GRAPH_KEYS = frozenset(GraphDef._fields)


def check_graph(value: Any, limits: Limits, payloads: Sequence[Any]) -> GraphDef:
    if type(value) is not dict or not set(value) <= _GRAPH_KEYS:
        raise bad(f"a graph must be a map with keys from {sorted(_GRAPH_KEYS)}")
    cap = limits.max_graph_tensors

    def part(key: str, bound: int) -> tuple[Any, ...]:
        items = value.get(key, ())
        if type(items) is not tuple or len(items) > bound:
            raise bad(f"graph {key} must be a list of at most {bound}")
        return items

    inputs = tuple(check_graph_tensor(v, limits, "input") for v in part("inputs", cap))
    binds = tuple(check_graph_tensor(v, limits, "bound tensor") for v in part("binds", cap))
    scalars = []
    for item in part("scalars", cap):
        if type(item) is not tuple or len(item) != 2 or item[1] not in (1, 2, 3) or type(item[1]) is not int:
            raise bad(f"each graph scalar must be [name, kind 1|2|3], got {describe(item)}")
        scalars.append(GraphScalar(check_name(item[0], limits, ()), item[1]))
    temps = []
    for item in part("temps", cap):
        if type(item) is not tuple or len(item) != 2:
            raise bad(f"each graph intermediate must be [dtype, shape], got {describe(item)}")
        temps.append((check_dtype(item[0], limits, ()), check_shape(item[1], limits, ())))
    names = [t.name for t in inputs] + [t.name for t in binds] + [t.name for t in scalars]
    if len(set(names)) != len(names):
        raise bad("the names of a graph's inputs, scalars and bound tensors must differ")
    counts: dict[int, int] = {ArgKind.INPUT: len(inputs), ArgKind.BIND: len(binds), ArgKind.TEMP: len(temps)}
    views: list[tuple[Arg, tuple[int, ...]]] = []
    for item in part("views", cap):
        if type(item) is not tuple or len(item) != 2:
            raise bad(f"each graph view must be [tensor, shape], got {describe(item)}")
        counts[ArgKind.VIEW] = len(views)  # a view names a tensor, or an earlier view
        views.append((check_graph_ref(item[0], counts, limits), check_shape(item[1], limits, ())))
    counts[ArgKind.VIEW] = len(views)
    with_scalars = {**counts, int(ArgKind.SCALAR): len(scalars)}
    steps: list[GraphDispatch | GraphCopy | GraphUpload] = []
    for step in part("steps", limits.max_graph_steps):
        if type(step) is not tuple or not step or type(step[0]) is not int:
            raise bad(f"a graph step must be a list [kind, ...], got {describe(step)}")
        if step[0] == 0 and len(step) == 5:
            _, kernel, grid, args, writes = step
            if type(args) is not tuple or len(args) > limits.max_args:
                raise bad(f"args must be a list of at most {limits.max_args}")
            refs = tuple(check_graph_ref(a, with_scalars, limits, scalars=True) for a in args)
            kernel, grid = check_handle(kernel, limits, ()), check_grid(grid, limits, ())
            steps.append(GraphDispatch(kernel, grid, refs, check_writes(writes, limits, ())))
        elif step[0] == 1 and len(step) == 3:
            steps.append(GraphCopy(check_graph_ref(step[1], counts, limits), check_graph_ref(step[2], counts, limits)))
        elif step[0] == 2 and len(step) == 3:
            steps.append(GraphUpload(check_frame(step[1], limits, payloads), check_graph_ref(step[2], counts, limits)))
        else:
            raise bad(f"unknown graph step {describe(step[0])} with {len(step) - 1} fields")
    outputs = []
    for item in part("outputs", cap):
        if type(item) is not tuple or len(item) != 2:
            raise bad(f"each graph output must be [name, tensor], got {describe(item)}")
        outputs.append(GraphOutput(check_name(item[0], limits, ()), check_graph_ref(item[1], counts, limits)))
    if len({o.name for o in outputs}) != len(outputs):
        raise bad("graph outputs need distinct names")
    rows = value.get("rows", False)
    if type(rows) is not bool:
        raise bad(f"graph rows must be true or false, got {describe(rows)}")
    feeds = _feeds(part("feeds", cap), {o.name for o in outputs}, {i.name for i in inputs}, limits)
    slots = value.get("slots", 0)
    if not is_int(slots) or not 0 <= slots <= limits.max_slots or (slots and not rows):
        raise bad(f"graph slots must be 0, or 1 to {limits.max_slots} in a graph of rows, got {describe(slots)}")
    state = tuple(check_graph_ref(ref, counts, limits) for ref in part("state", cap))
    if any(kind != ArgKind.TENSOR for kind, _ in state) or (state and not slots):
        raise bad("a graph's state is session tensors, in a graph of slots")
    pads = []
    for item in part("pads", cap):
        if type(item) is not tuple or len(item) != 2 or type(item[1]) not in (int, float) or not rows:
            raise bad(f"each graph pad must be [input, number] in a graph of rows, got {describe(item)}")
        if item[0] not in {i.name for i in inputs}:
            raise bad(f"graph pad {describe(item[0])} names no input")
        pads.append((item[0], item[1]))
    if len({name for name, _ in pads}) != len(pads):
        raise bad("a graph input has one pad at most")
    return GraphDef(
        inputs,
        tuple(scalars),
        binds,
        tuple(temps),
        tuple(steps),
        tuple(outputs),
        tuple(views),
        rows,
        feeds,
        slots,
        state,
        tuple(pads),
    )


def _feeds(items: tuple[Any, ...], outputs: set[str], inputs: set[str], limits: Limits) -> tuple[tuple[str, str], ...]:
    feeds: list[tuple[str, str]] = []
    for item in items:
        if type(item) is not tuple or len(item) != 2:
            raise bad(f"each graph feed must be [output, input], got {describe(item)}")
        output, target = (check_name(name, limits, ()) for name in item)
        if output not in outputs or target not in inputs:
            raise bad(f"graph feed [{output!r}, {target!r}]: an output of the graph into one of its inputs")
        feeds.append((output, target))
    if len({target for _, target in feeds}) != len(feeds):
        raise bad("a graph input is fed by one output at most")
    return tuple(feeds)
