"""Which graph serves a run (`gpud.backends.cuda.run_graphs`), without a GPU: graphs are plain objects here."""

from __future__ import annotations

from typing import Any

from gpud.backends.cuda.run_graphs import RunGraphs

SHAPE = (("scale", 16, 1, 1, 64, 1, 1, 0, 24),)


def run(runs: RunGraphs[str], arguments: bytes, built: list[str]) -> tuple[str, str | None]:
    """What `GraphRunner.issue` does with a run of SHAPE: ("launch", None), ("build", graph), ("patch", graph)
    or ("replay", graph)."""
    key = (SHAPE, (arguments,))
    graph, patch, build = runs.find(SHAPE, key)
    if graph is not None:
        return ("patch" if patch else "replay"), graph
    if not build:
        return "launch", None
    graph = f"graph {len(built)}"
    built.append(graph)
    runs.keep(SHAPE, key, graph)
    return "build", graph


def test_a_shape_seen_twice_gets_a_graph_patched_to_other_arguments() -> None:
    runs: RunGraphs[str] = RunGraphs(4, lambda _key, _graph: None)
    built: list[str] = []
    steps = [run(runs, arguments, built) for arguments in (b"a", b"a", b"a", b"b", b"a")]
    assert steps == [("launch", None), ("build", "graph 0"), ("replay", "graph 0"), ("patch", "graph 0"),
                     ("patch", "graph 0")]  # fmt: skip


def test_arguments_taking_turns_get_a_graph_each() -> None:
    runs: RunGraphs[str] = RunGraphs(4, lambda _key, _graph: None)
    built: list[str] = []
    steps = [run(runs, arguments, built)[0] for arguments in (b"a", b"b", b"a", b"b", b"a", b"b", b"a", b"b")]
    assert steps == ["launch", "build", "patch", "patch", "build", "replay", "replay", "replay"]
    assert len(runs.graphs) == 2


def test_evictions_go_one_at_a_time_and_forget_the_shapes_latest() -> None:
    evicted: list[Any] = []
    runs: RunGraphs[str] = RunGraphs(1, lambda key, graph: evicted.append((key[1], graph)))
    built: list[str] = []
    for arguments in (b"a", b"b", b"a", b"b", b"a"):  # a second graph evicts the first
        run(runs, arguments, built)
    assert evicted == [((b"b",), "graph 0")] and len(runs.graphs) == 1
    runs.clear()
    assert len(runs.graphs) == 0 and evicted[-1] == ((b"a",), "graph 1")
    assert run(runs, b"a", built) == ("launch", None)  # everything seen is forgotten too
