"""The client's calls for replay graphs: record one, publish it, open another session's (see
gpud_client.graphs)."""

from __future__ import annotations

import gpud_protocol as proto
from gpud_client.client_base import ClientBase
from gpud_client.graphs import Graph
from gpud_client.steps import Step
from gpud_protocol import ArgKind


class GraphCalls(ClientBase):
    def graph(self, name: str, *, rows: bool = False, slots: int = 0) -> Graph:
        """A recorder of a step to build once and replay in one message (see gpud_client.graphs).
        `rows=True`: a row-independent step, whose concurrent replays the daemon may merge; `slots=P`:
        also with state of P rows, a slot per session (`Graph.state`)."""
        return Graph(self, name, rows=rows, slots=slots)

    def publish_graph(self, step: Step, name: str) -> None:
        """Let every session open `step`'s graph (all its instances) by `name`."""
        self._queue(proto.PublishGraph(self._next_seq(), step.handle, name))

    async def open_graph(self, name: str) -> Step:
        """A published graph, to replay with this session's own inputs and bound tensors."""
        handle = next(self._handles)
        seq = self._next_seq()
        self._queue(proto.OpenGraph(seq, handle, name), request=seq)
        header, _ = await self._connection.request(seq)
        return Step(
            self,
            handle,
            name,
            int(header["device"]),
            [(n, d) for n, d in header["inputs"]],
            [(n, proto.SCALAR_NAMES[ArgKind(k)]) for n, k in header["scalars"]],
            [(n, d) for n, d in header["binds"]],
            list(header["outputs"]),
            {str(o): str(i) for o, i in header.get("feeds", ())},
        )

    def unpublish_graph(self, name: str) -> None:
        self._queue(proto.UnpublishGraph(self._next_seq(), name))
