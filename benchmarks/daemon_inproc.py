"""An in-process daemon for benchmarks of the daemon's own CPU cost: one fake device whose kernels do
nothing and one session, wired as the server wires them, and the connection a `gpud_client.Client`
uses, without a socket (batches go straight to the daemon's decoder; replies come back through the
event loop, as through the outboxes). Only the daemon's code is timed (`Clock`)."""

from __future__ import annotations

import asyncio
import cProfile
import time
from collections.abc import Callable, Coroutine
from typing import Any

import gpud_client
import gpud_protocol as proto
from gpud.backends.base import Program
from gpud.backends.fake import FAKE_KERNELS, FakeDevice, FakeKernel
from gpud.runtime.runtime import DeviceRuntime
from gpud.service.config import Config
from gpud.session.graphs import GraphStore
from gpud.session.merging import Merger
from gpud.session.residents import ResidentStore
from gpud.session.session import Session
from gpud_client.batch import OpQueue
from gpud_client.errors import from_code
from gpud_protocol.ops import KERNELS


def _noop(*_args: Any) -> None:
    pass


class NoOpDevice(FakeDevice):
    """The fake device, of kind "cuda": the op library's kernels compile (their .cu source is read)
    into no-ops with the interface of their spec, and the fake backend's test kernels (`fake:axpb`)
    into no-ops with theirs. Times what runs when a submission completes."""

    kind = "cuda"

    def __init__(self, index: int, loop: asyncio.AbstractEventLoop, clock: Clock) -> None:
        super().__init__(index, loop, 1 << 34)
        self._clock = clock

    def compile(self, key: tuple[Any, ...], source: str, entry: str, options: Any) -> Program:
        if source.startswith("fake:"):
            test = FAKE_KERNELS[entry]
            kernel = FakeKernel(_noop, test.tensors, test.scalars, test.writes)
        else:
            spec = KERNELS[entry]
            kinds = tuple(kind for _name, kind in spec.scalars)
            kernel = FakeKernel(_noop, len(spec.tensors), kinds, frozenset(spec.writes))
        return Program(key, entry, kernel, kernel.tensors, kernel.scalars, kernel.writes)

    def watch(self, submitted: Any, done: Callable[[BaseException | None], None], awaited: bool) -> None:
        clock = self._clock

        def timed(error: BaseException | None) -> None:
            with clock.measure("completion"):
                done(error)

        super().watch(submitted, timed, awaited)


class Clock:
    """Seconds spent in the daemon's code, by part; a profile of it when one is running."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {"intake": 0.0, "decode": 0.0, "completion": 0.0}
        self.profile: cProfile.Profile | None = None

    def measure(self, part: str) -> _Span:
        return _Span(self, part)

    def reset(self) -> None:
        self.seconds = dict.fromkeys(self.seconds, 0.0)


class _Span:
    __slots__ = ("_clock", "_part", "_t0")

    def __init__(self, clock: Clock, part: str) -> None:
        self._clock, self._part, self._t0 = clock, part, 0.0

    def __enter__(self) -> None:
        if self._clock.profile is not None:
            self._clock.profile.enable()
        self._t0 = time.perf_counter()

    def __exit__(self, *_exc: object) -> None:
        self._clock.seconds[self._part] += time.perf_counter() - self._t0
        if self._clock.profile is not None:
            self._clock.profile.disable()


class InProcessDaemon:
    """One device and one session, wired as the server wires them (what a Session needs of a daemon)."""

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        clock: Clock,
        config: Config | None = None,
        device: type[NoOpDevice] = NoOpDevice,
    ) -> None:
        self.config = config or Config()
        self.clock = clock
        self._loop = loop
        rt = DeviceRuntime(device(0, loop, clock), self.config, self._lost, self.config.limits.reply_part_bytes)
        self.runtimes = [rt]
        self.residents = ResidentStore(lambda tensor: rt.release(tensor.buffer))
        self.graph_store = GraphStore(lambda _session: True)
        self.merger = Merger()
        self.tasks: set[asyncio.Future[None]] = set()
        self.ops = 0
        self.dispatches = 0
        self._outbox: list[list[Any]] = []
        self._deliver: Callable[[list[Any]], None] = lambda _frames: None
        self.session = Session("bench", "daemon_ops", self._send, self, self.config, 0)

    @staticmethod
    def _lost(_rt: DeviceRuntime, error: BaseException) -> None:
        raise RuntimeError(f"the fake device was lost: {error}")

    def welcome(self) -> dict[str, Any]:
        config = self.config
        return {
            "t": "welcome",
            "session": self.session.id,
            "backend": self.runtimes[0].device.kind,
            "devices": [rt.info() for rt in self.runtimes],
            "device": 0,
            "limits": config.limits.as_dict(),
            "window": config.session_window,
        }

    def connect(self, deliver: Callable[[list[Any]], None]) -> None:
        self._deliver = deliver

    # ------------------------------------------------------------------ what the router does per message

    def receive(self, frames: list[Any]) -> None:
        session = self.session
        with self.clock.measure("intake"):
            received_at = time.perf_counter()
            message = proto.decode_client_message(
                [memoryview(f) for f in frames], self.config.limits, session.dispatch_memo
            )
            self.clock.seconds["decode"] += time.perf_counter() - received_at
            assert type(message) is proto.Batch
            session.receive(message, received_at)
            self.after_work()
        self.ops += len(message.ops)
        self.dispatches += sum(1 for op in message.ops if type(op) is proto.Memoized or type(op) is proto.Dispatch)

    # ------------------------------------------------------------------ what a Session needs of a daemon

    def spawn(self, coroutine: Coroutine[Any, Any, None]) -> None:
        task = asyncio.ensure_future(coroutine)
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    def after_work(self) -> None:
        for rt in self.runtimes:
            rt.after_drain()

    def _send(self, frames: list[Any]) -> None:
        """Replies leave through the loop, as through the outboxes: never inside the daemon's call."""
        if not self._outbox:
            self._loop.call_soon(self._post)
        self._outbox.append([bytes(f) for f in frames])

    def _post(self) -> None:
        outbox, self._outbox = self._outbox, []
        for frames in outbox:
            self._deliver(frames)


class Loopback:
    """What `gpud_client.Client` uses of a connection, in process: batches go to the daemon's intake."""

    def __init__(self, daemon: InProcessDaemon) -> None:
        self.welcome = daemon.welcome()
        self.limits = proto.Limits(**self.welcome["limits"])
        self.address = "in-process"
        self.lost: gpud_client.GpudError | None = None
        self.last_trace = None
        self.queue = OpQueue(self.limits, int(self.welcome["window"]))
        self._daemon = daemon
        self._futures: dict[int, asyncio.Future[tuple[dict[str, Any], Any]]] = {}
        self._unreported: BaseException | None = None
        daemon.connect(self._on_message)

    def send_batch(self) -> None:
        frames = self.queue.take()
        if frames is not None:
            self._daemon.receive(frames)

    async def send_held(self) -> None:
        return None

    async def request(self, seq: int, expected: Any = None) -> tuple[dict[str, Any], Any]:
        return await self.submit(seq, expected)

    def submit(self, seq: int, expected: Any = None) -> Coroutine[Any, Any, tuple[dict[str, Any], Any]]:
        """Sent now (as `Rpc.submit`, which spins: `expected` is of no use here); awaited for the reply."""
        if (unreported := self._unreported) is not None:
            self._unreported = None
            raise unreported
        future: asyncio.Future[tuple[dict[str, Any], Any]] = asyncio.get_running_loop().create_future()
        self._futures[seq] = future
        self.send_batch()
        return self._reply(seq, future)

    async def _reply(self, seq: int, future: asyncio.Future[tuple[dict[str, Any], Any]]) -> tuple[dict[str, Any], Any]:
        try:
            return await future
        finally:
            self._futures.pop(seq, None)

    def expect(self, seq: int) -> None:
        future = self._futures[seq] = asyncio.get_running_loop().create_future()

        def done(f: asyncio.Future[Any]) -> None:
            self._futures.pop(seq, None)
            if not f.cancelled() and f.exception() is not None and self._unreported is None:
                self._unreported = f.exception()

        future.add_done_callback(done)

    def name_op(self, seq: int, op: str) -> None:
        return None

    def _on_message(self, frames: list[Any]) -> None:
        header, payload = proto.decode_server_message(frames, self.limits)
        kind = header["t"]
        if kind == "receipt":
            self.queue.receipt(int(header["b"]))
            return
        if kind != "reply":
            raise RuntimeError(f"unexpected message from the daemon: {header}")
        if int(header.get("parts", 1)) > 1:
            raise RuntimeError("a readback in several parts: make the benchmark's tensors smaller")
        seq = header["seq"]
        self.queue.replied(seq)
        future = self._futures.get(seq)
        if header["ok"]:
            if future is not None and not future.done():
                future.set_result((header, memoryview(payload[0]) if payload else None))
            return
        code, message, failed_seq, op = header["err"]
        self.queue.acks.add(failed_seq)
        error = from_code(code, message, seq=failed_seq, op=op)
        if future is not None and not future.done():
            future.set_exception(error)
        else:
            self._unreported = error
