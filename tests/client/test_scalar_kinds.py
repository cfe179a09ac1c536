"""The client spells no scalar kind of its own: graphs, the op library and opened graphs take them from
gpud_protocol's one definition (SCALAR_KINDS, SCALAR_NAMES)."""

from __future__ import annotations

from typing import Any

import pytest

import gpud_protocol as proto
from gpud_client import graphs
from gpud_client.errors import InvalidArgument
from gpud_client.graphs import Graph
from gpud_client.ops import base
from gpud_client.values import Scalar


def test_op_library_scalars_follow_the_protocol() -> None:
    for name, kind in proto.SCALAR_KINDS.items():
        made = base.scalar_of(name, 3)
        assert made == Scalar(int(kind), 3) and type(made.value) is (float if kind == proto.ArgKind.F32 else int)
    assert not hasattr(base, "SCALAR_KINDS")  # no second spelling


def test_graph_scalars_follow_the_protocol() -> None:
    recorder = Graph(Any, "g")  # type: ignore[arg-type]  # recording a scalar sends nothing
    for name, kind in proto.SCALAR_KINDS.items():
        assert recorder.scalar(f"s_{name}", name).kind == int(kind)
    with pytest.raises(InvalidArgument, match=r"\['f32', 'i32', 'u32'\]"):
        recorder.scalar("x", "f64")
    assert not hasattr(graphs, "_KINDS")
