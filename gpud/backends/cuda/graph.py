"""Runs of launches issued on the stream: one by one, or as a CUDA graph replayed with patched nodes.

A run is the launches between two other commands of a submission (a replay graph's step is one).
Which graph serves a run is `run_graphs.RunGraphs`' choice (keyed by the run's shape and argument bytes):
a graph of explicit kernel nodes (a chain), built the second time a shape is seen, and patched where a
run's arguments differ: only the kernel nodes whose argument bytes differ are updated
(`cuGraphExecKernelNodeSetParams`, the way tinygrad's CUDAGraph patches its inputs).
Shorter runs than `min_launches` are launched one by one; a cache size of 0 never builds graphs.

With `pdl`, the edge into a node whose kernel comes from the op library's CUDA sources (its module in
`waiting`: every entry point of those waits for the kernel before it first, gpud/ops/pdl.cu) is
programmatic: its blocks are launched while the kernel before it finishes, hiding the launch gap
between kernels. Any other kernel (a session's own source) gets a full edge. Where the driver or its
bindings refuse programmatic edges, the runner says so once and builds full edges from then on.

`issue` runs on whichever thread submits (one submission at a time); unloading a module (loop
thread) drops every graph, since a graph must not outlive a kernel it launches. `lock` guards the
caches for both. A graph that leaves the cache may still be used by the submission being issued:
it goes to a dead list, which the device takes right after recording that submission's event
(`take_dead`) and destroys once the event has completed.
"""

from __future__ import annotations

import ctypes
import dataclasses
import logging
import threading
from collections.abc import Iterable, Sequence
from typing import Any

from gpud.backends.cuda import tma
from gpud.backends.cuda.driver import check, cu, error
from gpud.backends.cuda.run_graphs import RunGraphs
from gpud_protocol.lru import LruCache

log = logging.getLogger(__name__)

Run = Sequence[tuple[Any, ...]]  # packed launches, see `launch.pack`


def _add_edge(graph: Any, before: Any, node: Any, edge: Any) -> None:
    """The edge before -> node, with `edge` data (None: a full edge)."""
    data = None if edge is None else [edge]
    if (add := getattr(cu, "cuGraphAddDependencies_v2", None)) is not None:  # cuda-bindings 12
        check(add(graph, [before], [node], data, 1), "a graph edge")
    else:  # cuda-bindings 13: the edge data is part of cuGraphAddDependencies
        check(cu.cuGraphAddDependencies(graph, [before], [node], data, 1), "a graph edge")


@dataclasses.dataclass(eq=False)
class _Graph:
    exec: Any
    graph: Any  # kept: the node handles belong to it
    nodes: list[Any]
    node_params: list[Any]  # CUDA_KERNEL_NODE_PARAMS of each node (pointing at the shared slots)
    values: list[bytes]  # the argument bytes each node holds now


@dataclasses.dataclass(eq=False)
class ReplayRun:
    """A run of a replay graph's instantiated step: the same object every replay, so its CUDA graph is
    found by identity, and only the launches with per-replay scalars are compared and patched."""

    launches: list[tuple[Any, ...]]


class GraphRunner:
    def __init__(self, stream: Any, max_args: int, cache_size: int, min_launches: int, pdl: bool = False) -> None:
        self.lock = threading.Lock()
        self.waiting: set[int] = set()  # module ids whose kernels wait for the one before them (the device's)
        self._pdl = pdl
        self.programmatic_edges = 0
        self._stream = stream
        self._cache_size = cache_size
        self._min_launches = min_launches
        self._dead: list[_Graph] = []
        self._runs: RunGraphs[_Graph] = RunGraphs(max(1, cache_size), self._evicted)
        self._replays: LruCache[ReplayRun, _Graph] = LruCache(max(1, cache_size), self._evicted)
        self._generation = 0  # bumped when the caches are dropped: a graph built meanwhile is not cached
        self.built = 0
        self.replays = 0
        self.patched_nodes = 0
        # Launch parameters: one 8-byte slot per argument and a void* array pointing at the slots.
        # cuLaunchKernel and the node-parameter calls copy the values, so one buffer serves all. The
        # kernels of modules in `tma_modules` take two tensor maps first: their own array of pointers.
        slots = max(max_args, tma.MAPS)
        self.tma_modules: set[int] = set()
        self._params = (ctypes.c_uint64 * (slots + (tma.MAP_BYTES // 8 - 1) * tma.MAPS))()
        self._params_address = ctypes.addressof(self._params)
        self._pointers = (ctypes.c_void_p * slots)(*(self._params_address + 8 * i for i in range(slots)))
        self._pointers_address = ctypes.addressof(self._pointers)
        offsets = tma.TmaLayout(0, 0, 0).offsets(slots)
        self._map_pointers = (ctypes.c_void_p * slots)(*(self._params_address + o for o in offsets))
        self._map_pointers_address = ctypes.addressof(self._map_pointers)

    def issue(self, run: Run) -> None:
        """Put the run on the stream (on the submitting thread, with the context current)."""
        if self._cache_size == 0 or len(run) < self._min_launches:
            self._launch_all(run)
            return
        shape = tuple([(*launch[:-1], len(launch[-1])) for launch in run])
        key = (shape, tuple([launch[-1] for launch in run]))
        with self.lock:
            graph, patch, build = self._runs.find(shape, key)
            generation = self._generation
        if graph is not None:
            if patch:
                self._patch(graph, run)
            self.replays += 1
            check(cu.cuGraphLaunch(graph.exec, self._stream), "replaying a graph")
            return
        if not build:
            self._launch_all(run)
            return
        graph = self._build(run)
        self.built += 1
        try:
            check(cu.cuGraphLaunch(graph.exec, self._stream), "launching a graph")
        except BaseException:
            with self.lock:
                self._dead.append(graph)
            raise
        with self.lock:
            if self._generation == generation:
                self._runs.keep(shape, key, graph)  # may evict another into the dead list
            else:
                self._dead.append(graph)  # a module was unloaded meanwhile

    def replay(self, run: ReplayRun, patches: Sequence[tuple[int, bytes]]) -> None:
        """A replay graph's run: its CUDA graph (built the first time), with the patched launches updated."""
        if self._cache_size == 0:
            launches = list(run.launches)
            for index, values in patches:
                launches[index] = (*launches[index][:-1], values)
            self._launch_all(launches)
            return
        with self.lock:
            graph = self._replays.get(run)
            generation = self._generation
        if graph is None:
            launches = list(run.launches)
            for index, values in patches:
                launches[index] = (*launches[index][:-1], values)
            graph = self._build(launches)
            self.built += 1
            with self.lock:
                if self._generation == generation:
                    self._replays.put(run, graph)
                else:
                    self._dead.append(graph)
        else:
            current = graph.values
            for index, values in patches:
                if values != current[index]:
                    self._set(graph, index, values)
            self.replays += 1
        check(cu.cuGraphLaunch(graph.exec, self._stream), "replaying a graph")

    def _set(self, graph: _Graph, index: int, values: bytes) -> None:
        ctypes.memmove(self._params_address, values, len(values))
        check(
            cu.cuGraphExecKernelNodeSetParams(graph.exec, graph.nodes[index], graph.node_params[index]),
            "updating a graph node",
        )
        graph.values[index] = values
        self.patched_nodes += 1

    def _pointers_of(self, module: int) -> int:
        return self._map_pointers_address if module in self.tma_modules else self._pointers_address

    def _launch_all(self, run: Run) -> None:
        params, stream = self._params_address, self._stream
        for module, function, gx, gy, gz, bx, by, bz, shared, values in run:
            ctypes.memmove(params, values, len(values))
            pointers = self._pointers_of(module)
            (status,) = cu.cuLaunchKernel(function, gx, gy, gz, bx, by, bz, shared, stream, pointers, 0)
            if status:
                raise error(status, "launching a kernel")

    def _node_params(self, launch: tuple[Any, ...]) -> Any:
        module, function, gx, gy, gz, bx, by, bz, shared, values = launch
        params = cu.CUDA_KERNEL_NODE_PARAMS()
        params.func = function
        params.gridDimX, params.gridDimY, params.gridDimZ = gx, gy, gz
        params.blockDimX, params.blockDimY, params.blockDimZ = bx, by, bz
        params.sharedMemBytes = shared
        params.kernelParams = self._pointers_of(module)
        ctypes.memmove(self._params_address, values, len(values))
        return params

    def _build(self, run: Run) -> _Graph:
        """A graph of the run as a chain of explicit kernel nodes, instantiated."""
        graph = check(cu.cuGraphCreate(0), "creating a graph")
        nodes: list[Any] = []
        node_params: list[Any] = []
        try:
            for launch in run:
                params = self._node_params(launch)
                early = bool(nodes) and self._pdl and launch[0] in self.waiting
                dependencies = [] if early else nodes[-1:]
                node = check(cu.cuGraphAddKernelNode(graph, dependencies, len(dependencies), params), "a graph node")
                if early and not self._programmatic_edge(graph, nodes[-1], node):
                    _add_edge(graph, nodes[-1], node, None)
                nodes.append(node)
                node_params.append(params)
            exec_ = check(cu.cuGraphInstantiate(graph, 0), "instantiating a graph")
        except BaseException:
            cu.cuGraphDestroy(graph)
            raise
        return _Graph(exec_, graph, nodes, node_params, [launch[-1] for launch in run])

    def _programmatic_edge(self, graph: Any, before: Any, node: Any) -> bool:
        """Add the programmatic edge before -> node; False (and no more tries) where it is refused."""
        try:
            edge = cu.CUgraphEdgeData()
            edge.type = cu.CUgraphDependencyType.CU_GRAPH_DEPENDENCY_TYPE_PROGRAMMATIC
            edge.from_port = cu.CU_GRAPH_KERNEL_NODE_PORT_PROGRAMMATIC
            _add_edge(graph, before, node, edge)
        except Exception as exc:
            log.warning("programmatic dependent launch is off: %s", exc)
            self._pdl = False
            return False
        self.programmatic_edges += 1
        return True

    def _patch(self, graph: _Graph, run: Run) -> None:
        """Update the nodes whose argument bytes differ from what the graph holds."""
        values = graph.values
        for index, launch in enumerate(run):
            if launch[-1] != values[index]:
                self._set(graph, index, launch[-1])

    def _evicted(self, _key: Any, graph: _Graph) -> None:
        self._dead.append(graph)  # under the lock: every put and clear holds it

    def forget_all(self) -> None:
        """Drop every graph and every run seen (a module is being unloaded)."""
        with self.lock:
            self._runs.clear()
            self._replays.clear()
            self._generation += 1

    def take_dead(self) -> list[Any]:
        """Graphs that left the cache: destroy them once the submission just recorded completed."""
        with self.lock:
            dead, self._dead = self._dead, []
        return dead

    @staticmethod
    def destroy(graphs: Iterable[Any]) -> None:
        for graph in graphs:
            (status,) = cu.cuGraphExecDestroy(graph.exec)
            if status:
                log.debug("cuGraphExecDestroy: %s", error(status))
            cu.cuGraphDestroy(graph.graph)

    def stats(self) -> dict[str, Any]:
        with self.lock:
            cache = self._runs.graphs.stats()
            cache["replay_graphs"] = len(self._replays)
        return {
            "graph_cache": cache,
            "graphs_captured": self.built,
            "graph_replays": self.replays,
            "graph_nodes_patched": self.patched_nodes,
            "graph_pdl": self._pdl,
            "graph_programmatic_edges": self.programmatic_edges,
        }
