"""The daemon: a ZeroMQ ROUTER socket, the sessions, their leases, and the receive loop.

One reader drains the messages that are ready, in slices that yield to the rest of the event loop
(intake.py). Pings and beats are answered at once; batches go to their sessions round-robin (so no
client starves), which execute them or park; then every device runtime decides whether to flush, so
work that arrives together lands in one command buffer. The loop never waits for a GPU: a session
that must wait parks on its own, and replies go out through per-peer outboxes that never block.
Peers without a session live on a small budget of messages and reply bytes (budget.py, peers.py).

As a service: `READY=1` goes to systemd once every device is open and the socket bound; a task on
the loop sends `STATUS=` every few seconds and `WATCHDOG=1` while work makes progress (see
health.py); a `{"t": "status"}` message is answered without a session (`gpud status`, `gpud stats`,
the Prometheus endpoint use the same snapshot). SIGTERM starts a drain: `STOPPING=1`, new sessions
and new batches are refused with Busy("the daemon is stopping"), work already accepted runs to its
end for at most `drain_timeout_s`, then every session still waiting is told its requests will not
be answered, and the daemon exits 0.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import hmac
import logging
import os
import secrets
import signal
import time
from collections import OrderedDict, defaultdict
from collections.abc import Coroutine, Iterator
from pathlib import Path
from typing import Any

import anyio
import anyio.abc
import zmq
import zmq.auth

import gpud_protocol as proto
from gpud import __version__
from gpud.backends import open_devices
from gpud.runtime.cache import LruCache
from gpud.runtime.runtime import DeviceRuntime
from gpud.service.budget import OWN_BUDGET_ONLY, SessionlessBudget
from gpud.service.config import Config
from gpud.service.health import Health, assess
from gpud.service.intake import Intake
from gpud.service.lifecycle import ipc_endpoint
from gpud.service.metrics import MetricsServer
from gpud.service.notify import Notifier, watchdog_interval
from gpud.service.peers import Outboxes
from gpud.session.graphs import GraphStore
from gpud.session.residents import ResidentStore
from gpud.session.session import Session
from gpud.session.tensors import Tensor
from gpud_protocol import ErrorCode, ProtocolViolation
from gpud_protocol.errors import Busy, DeviceLost
from gpud_protocol.reader import SocketReader
from gpud_protocol.schema import Status

log = logging.getLogger(__name__)

PEER_SEND_QUEUE = 64  # messages ZeroMQ queues per peer; more wait in the peer's outbox
EXIT_DEVICE_LOST = 3
STATUS_EVERY_S = 2.0  # how often systemd's STATUS= line is refreshed
STOPPING = "the daemon is stopping"
LIST_CAP = 1024  # sessions, residents and graphs listed in a status reply (the totals are exact)


class Server:
    def __init__(self, config: Config, config_file: Path | None = None) -> None:
        self.config = config
        self.config_file = config_file  # where the settings came from (None: defaults and flags)
        self.sessions: dict[bytes, Session] = {}
        self._by_id: dict[str, Session] = {}
        self._ended: LruCache[bytes, str] = LruCache(4096)  # identity -> why its session ended
        self.runtimes: list[DeviceRuntime] = []
        self.residents = ResidentStore(self._release, self._is_connected)
        self.graph_store = GraphStore(self._is_connected)
        self._ctx = zmq.Context()
        self._sock: zmq.Socket[bytes] | None = None
        self._reader: SocketReader | None = None
        self._intake: Intake | None = None
        self._budget = SessionlessBudget(config.sessionless_rate, config.sessionless_total_rate)
        self._outboxes: Outboxes | None = None
        self._tasks: anyio.abc.TaskGroup | None = None
        self._fatal: BaseException | None = None
        self._stop = anyio.Event()
        self.notifier = Notifier()
        self.counters: defaultdict[str, int] = defaultdict(int)
        self.started_at = time.monotonic()
        self.stopping = False  # draining after SIGTERM: new work is refused
        self.health = Health(True, (), ())
        self._clients: dict[str, tuple[str, int, float]] = {}  # session id -> (client name, pid, opened at)
        self._metrics: MetricsServer | None = None
        self._linger_ms = 0  # on close: how long ZeroMQ may still send the last replies
        self._close_timeout = config.drain_timeout_s  # at shutdown: wait this long for the devices

    async def serve(self, ready: anyio.Event | None = None) -> int:
        """Run until SIGTERM/SIGINT, `stop()`, or a fatal device error; return the exit code."""
        config = self.config
        with self._listening():
            loop = asyncio.get_running_loop()
            devices = open_devices(config.backend, config.devices, loop, config)
            self.runtimes = [
                DeviceRuntime(device, config, self._device_lost, config.limits.reply_part_bytes) for device in devices
            ]
            self.residents = ResidentStore(
                self._release, self._is_connected, config.resident_max_count, config.resident_max_bytes
            )
            # Long-lived startup objects need no more scanning, and the hot path allocates many
            # short-lived tuples: a larger first generation cuts collection pauses by about a quarter.
            gc.freeze()
            gc.set_threshold(50_000, 20, 100)
            for rt in self.runtimes:
                log.info("device %d: %s", rt.index, _describe(rt.info()))
                if rt.device.software:
                    log.warning(
                        "device %d is a software rasteriser (lavapipe): slow, and Mesa cuts every shader loop "
                        "at 65,535 iterations, silently",
                        rt.index,
                    )
            log.info(
                "gpud %s serving %s with %d device(s); settings: %s",
                __version__,
                config.address,
                len(self.runtimes),
                self.config_file or "defaults and flags (no config file)",
            )
            try:
                if config.metrics_address:  # a port in use: one line, exit 2, the devices closed
                    self._metrics = MetricsServer(config.metrics_address, self.status)
                    await self._metrics.start()
                async with anyio.create_task_group() as tg:
                    self._tasks = tg
                    tg.start_soon(self._receive_loop)
                    tg.start_soon(self._lease_loop)
                    tg.start_soon(self._outbox_loop)
                    tg.start_soon(self._signals)
                    tg.start_soon(self._health_loop)
                    if ready is not None:
                        ready.set()
                    self.notifier.send("READY=1", f"STATUS={self.status_line()}")
                    await self._stop.wait()
                    tg.cancel_scope.cancel()
            finally:
                if self._metrics is not None:
                    self._metrics.close()
                await self._shutdown()
                self.notifier.close()
        if self._fatal is not None:
            log.error("exiting after a fatal device error: %s", self._fatal)
            return EXIT_DEVICE_LOST
        return 0

    def stop(self) -> None:
        """Stop now, without a drain (tests; a fatal device error)."""
        self._stop.set()

    def begin_stop(self, why: str) -> None:
        """Refuse new work, finish what was accepted (at most `drain_timeout_s`), then stop."""
        if self.stopping:
            return
        self.stopping = True
        log.info("%s: draining (at most %.1f s), new work is refused", why, self.config.drain_timeout_s)
        self.notifier.send("STOPPING=1", f"STATUS={self.status_line()}")
        assert self._tasks is not None
        self._tasks.start_soon(self._drain)

    # ------------------------------------------------------------------ what sessions use

    def spawn(self, coroutine: Coroutine[Any, Any, None]) -> None:
        """Run a parked session's resumption in the server's task group."""
        assert self._tasks is not None

        async def run() -> None:
            try:
                await coroutine
            except Exception:  # a bug in one session must not take the daemon down
                log.exception("a session task failed")

        self._tasks.start_soon(run)

    def after_work(self) -> None:
        for rt in self.runtimes:
            rt.after_drain()

    def _release(self, tensor: Tensor) -> None:
        self.runtimes[tensor.device].release(tensor.buffer)

    def _is_connected(self, session_id: str) -> bool:
        return session_id in self._by_id

    # ------------------------------------------------------------------ socket

    @contextlib.contextmanager
    def _listening(self) -> Iterator[zmq.Socket[bytes]]:
        address, limits = self.config.address, self.config.limits
        sock = self._ctx.socket(zmq.ROUTER)
        sock.setsockopt(zmq.ROUTER_MANDATORY, 1)
        sock.setsockopt(zmq.SNDHWM, PEER_SEND_QUEUE)
        sock.setsockopt(zmq.RCVHWM, 1024)
        sock.setsockopt(zmq.MAXMSGSIZE, max(limits.max_message_bytes, limits.max_header_bytes) + 4096)
        sock.setsockopt(zmq.LINGER, 0)
        with contextlib.ExitStack() as stack:
            if address.startswith("ipc://"):
                stack.enter_context(ipc_endpoint(Path(address[len("ipc://") :])))
            elif address.startswith("tcp://"):
                self._secure_tcp(sock)
            else:
                raise ValueError(f"unsupported address {address!r}: use ipc:// or tcp://")
            sock.bind(address)
            if address.startswith("ipc://"):
                os.chmod(address[len("ipc://") :], 0o660)
            self._sock = sock
            self._reader = SocketReader(sock)
            self._intake = Intake(self._reader, self.config.busy_poll_us)
            config = self.config
            self._outboxes = Outboxes(
                sock,
                self._reader.poke,
                self._peer_stuck,
                config.session_reply_bytes,
                config.lease_s,
                config.sessionless_reply_bytes,
            )
            try:
                yield sock
            finally:
                self._reader.close()
                sock.close(linger=self._linger_ms)  # a drain's last replies may still be on their way
                self._ctx.term()

    def _secure_tcp(self, sock: zmq.Socket[bytes]) -> None:
        key_file = self.config.curve_secret_key
        if key_file:
            public, secret = zmq.auth.load_certificate(key_file)
            if secret is None:
                raise ValueError(f"{key_file} holds no secret key")
            sock.curve_server = True
            sock.curve_secretkey = secret
            sock.curve_publickey = public
        elif not self.config.insecure_tcp:
            raise ValueError("tcp:// needs CURVE keys (--curve-secret-key); pass --insecure-tcp to allow plain tcp")
        else:
            log.warning("serving plain tcp without authentication: anyone who reaches the port can use the GPU")

    def _send(self, identity: bytes, frames: list[Any]) -> None:
        assert self._outboxes is not None
        self._outboxes.send(identity, frames, identity not in self.sessions)

    def _peer_stuck(self, identity: bytes, reason: str) -> None:
        self._end_session(identity, reason)

    # ------------------------------------------------------------------ loops

    async def _receive_loop(self) -> None:
        assert self._intake is not None
        intake, budget = self._intake, self._budget
        limits = self.config.limits
        while True:
            messages = await intake.next_slice()
            received_at = time.perf_counter()
            now = time.monotonic()
            self.counters["messages"] += len(messages)
            work: list[tuple[bytes, Any]] = []
            for identity, frames in messages:
                session = self.sessions.get(identity)
                if session is None and not budget.peer(identity, now):
                    continue  # over its own budget: dropped, not even decoded
                try:
                    memo = session.dispatch_memo if session is not None else None
                    message = proto.decode_client_message([f.buffer for f in frames], limits, memo)
                except ProtocolViolation as exc:
                    if session is None and not budget.total(now):
                        continue
                    self.counters["bad_messages"] += 1
                    level = logging.INFO if session is not None else logging.DEBUG  # garbage leaves no log flood
                    log.log(level, "bad message from %s: %s", identity.hex(), exc.message)
                    self._send(identity, [proto.encode_error(exc.code, exc.message)])
                    continue
                except Exception as exc:  # a decoder bug must not take the daemon down for everyone
                    if session is None and not budget.total(now):
                        continue
                    log.exception("internal error decoding a message from %s", identity.hex())
                    self._send(identity, [proto.encode_error(ErrorCode.INTERNAL, f"internal error decoding: {exc}")])
                    continue
                if session is not None:
                    session.last_seen = now
                elif type(message) not in OWN_BUDGET_ONLY and not budget.total(now):
                    continue
                if type(message) is proto.Ping and session is not None:
                    self._send(identity, [proto.PONG])  # answered before any work of this drain
                elif type(message) is proto.Beat:
                    self._beat(identity, message)
                elif type(message) is Status:  # not an op: a session's status requests have that budget too
                    if session is None or budget.peer(identity, now):
                        self.counters["status_requests"] += 1
                        self._send(identity, [proto.pack({"t": "status", **self.status()})])
                else:
                    work.append((identity, message))
            for identity, message in _round_robin(work):
                try:
                    self._handle(identity, message, received_at)
                except Exception as exc:  # a bug must not take the daemon down for everyone
                    log.exception("internal error handling a message from %s", identity.hex())
                    self._send(identity, [proto.encode_error(ErrorCode.INTERNAL, f"internal error: {exc}")])
            self.after_work()

    def _handle(self, identity: bytes, message: Any, received_at: float) -> None:
        session = self.sessions.get(identity)
        match message:
            case proto.Batch() if session is not None:
                self.counters["batches"] += 1
                self.counters["ops"] += len(message.ops)
                if self.stopping:
                    self.counters["refused_stopping"] += 1
                    session.failures.acknowledge(message.ack)
                    session._refuse(message, Busy(STOPPING))  # every op fails; each request is answered
                else:
                    session.receive(message, received_at)
            case proto.Hello() if self.stopping:
                self.counters["refused_stopping"] += 1
                self._send(identity, [proto.encode_error(ErrorCode.BUSY, f"{STOPPING}: connect to it again later")])
            case proto.Hello():
                self._hello(identity, message)
            case proto.Bye():
                self._end_session(identity, "said bye")
            case _:
                reason = self._ended.get(identity)
                text = f"session ended: {reason}; connect again" if reason else "no session: send hello first"
                self._send(identity, [proto.encode_error(ErrorCode.SESSION, text)])

    def _hello(self, identity: bytes, hello: proto.Hello) -> None:
        config = self.config
        if hello.version != proto.PROTOCOL_VERSION:
            message = f"protocol version {hello.version} unsupported; this daemon speaks {proto.PROTOCOL_VERSION}"
            self._send(identity, [proto.encode_error(ErrorCode.PROTOCOL, message)])
            return
        self._end_session(identity, "reconnected")  # a reconnect with the same identity starts afresh
        if len(self.sessions) >= config.max_sessions:
            self._send(identity, [proto.encode_error(ErrorCode.BUSY, f"{config.max_sessions} sessions: no room")])
            return
        if hello.device is not None and hello.device >= len(self.runtimes):
            text = f"no device {hello.device}: this daemon has {len(self.runtimes)}"
            self._send(identity, [proto.encode_error(ErrorCode.INVALID_ARGUMENT, text)])
            return
        device = hello.device if hello.device is not None else self._least_loaded()
        session_id = secrets.token_hex(8)

        def send(frames: list[Any]) -> None:
            self._send(identity, frames)

        session = Session(session_id, f"{hello.name}[{hello.pid}]", send, self, config, device)
        session.beat_key = secrets.token_hex(16)
        self.sessions[identity] = session
        self._by_id[session_id] = session
        self.runtimes[device].sessions += 1
        self._clients[session_id] = (hello.name, hello.pid, time.monotonic())
        self.counters["sessions_opened"] += 1
        log.info("session %s opened by %s (pid %s) on device %d", session_id, hello.name or "?", hello.pid, device)
        welcome = {
            "t": "welcome",
            "v": proto.PROTOCOL_VERSION,
            "session": session_id,
            "key": session.beat_key,
            "daemon": __version__,
            "backend": self.runtimes[0].device.kind,
            "devices": [rt.info() for rt in self.runtimes],
            "device": device,
            "limits": config.limits.as_dict(),
            "lease_s": config.lease_s,
            "max_requests": config.session_max_requests,
            "window": config.session_window,
        }
        self._send(identity, [proto.pack(welcome)])

    def _least_loaded(self) -> int:
        return min(self.runtimes, key=lambda rt: (rt.sessions, rt.memory_in_use, rt.index)).index

    def _beat(self, identity: bytes, beat: proto.Beat) -> None:
        session = self._by_id.get(beat.session)
        if session is None or not hmac.compare_digest(session.beat_key.encode(), beat.key.encode()):
            self._send(identity, [proto.encode_error(ErrorCode.SESSION, "no such session")])
            return
        session.last_seen = time.monotonic()

    def _end_session(self, identity: bytes, reason: str) -> None:
        session = self.sessions.pop(identity, None)
        if self._outboxes is not None and reason != "reconnected":
            self._outboxes.drop(identity)
        if session is None:
            return
        self._by_id.pop(session.id, None)
        self.runtimes[session.device].sessions -= 1
        session.close()
        self._ended.put(identity, reason)
        self.counters["sessions_ended"] += 1
        name, pid, opened = self._clients.pop(session.id, ("?", 0, time.monotonic()))
        log.info(
            "session %s of %s (pid %s) ended after %.1f s: %s",
            session.id,
            name or "?",
            pid,
            time.monotonic() - opened,
            reason,
        )

    async def _lease_loop(self) -> None:
        lease = self.config.lease_s
        while True:
            await anyio.sleep(lease / 4)
            # Judge by the last time every waiting message had been read, not by the clock: while
            # the loop is behind, heartbeats wait unread in the socket and prove nothing.
            assert self._intake is not None
            deadline = self._intake.caught_up() - lease
            for identity, session in list(self.sessions.items()):
                if session.last_seen < deadline:
                    self._end_session(identity, f"its lease expired (no message for {lease:.1f} s)")

    async def _outbox_loop(self) -> None:
        assert self._outboxes is not None
        outboxes = self._outboxes
        while True:
            await anyio.sleep(0.0005 if outboxes else 0.05)
            if outboxes:
                outboxes.retry()

    async def _signals(self) -> None:
        with anyio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
            async for signum in signals:
                name = signal.Signals(signum).name
                if self.stopping:
                    log.warning("%s during the drain: stopping now", name)
                    self.stop()
                    return
                self.begin_stop(name)

    async def _drain(self) -> None:
        """Until every accepted op has run and every request been answered, or `drain_timeout_s`."""
        timeout = self.config.drain_timeout_s
        deadline = time.monotonic() + timeout
        while not self._drained() and time.monotonic() < deadline:
            for rt in self.runtimes:
                if rt.has_pending:
                    rt.flush()
            await anyio.sleep(0.005)
        waiting = [
            (identity, session) for identity, session in self.sessions.items() if not self._session_drained(session)
        ]
        if waiting or not self._drained():
            log.warning("drain: work still pending after %.1f s (%d session(s) waiting)", timeout, len(waiting))
        for identity, _ in waiting:
            text = f"{STOPPING}: its drain ({timeout:g} s) ended before this session's pending requests completed"
            self._send(identity, [proto.encode_error(ErrorCode.SESSION, text)])
        self._linger_ms = 1000
        log.info("drain done in %.2f s", timeout - max(0.0, deadline - time.monotonic()))
        self._close_timeout = max(0.0, deadline - time.monotonic())
        self.stop()

    def _drained(self) -> bool:
        if any(rt.has_pending or rt.ledger.in_flight for rt in self.runtimes):
            return False
        if self._outboxes:
            return False
        return all(self._session_drained(session) for session in self.sessions.values())

    @staticmethod
    def _session_drained(session: Session) -> bool:
        return not (session._parked or session._backlog or session.requests_in_flight)

    async def _health_loop(self) -> None:
        """Health, STATUS= and the watchdog, from a task of the loop itself: a loop that stops
        running stops feeding the watchdog too."""
        watchdog = watchdog_interval()  # half of WatchdogSec=
        tick = min(watchdog, 1.0) if watchdog else 1.0
        last_status = last_ping = time.monotonic()
        while True:
            await anyio.sleep(tick)
            now = time.monotonic()
            health = self.assess(now)
            changed = health.healthy != self.health.healthy
            if changed and not health.healthy:
                log.warning("unhealthy: %s", "; ".join(health.problems))
            elif changed:
                log.info("healthy again: work is completing")
            self.health = health
            if watchdog is not None and health.healthy and now - last_ping >= watchdog * 0.95:
                self.notifier.send("WATCHDOG=1")
                last_ping = now
            if changed or now - last_status >= STATUS_EVERY_S:
                self.notifier.send(f"STATUS={self.status_line()}")
                last_status = now

    def assess(self, now: float | None = None) -> Health:
        now = time.monotonic() if now is None else now
        return assess(self.runtimes, self.config.health_stall_s, now, self._fatal)

    def _device_lost(self, rt: DeviceRuntime, error: DeviceLost) -> None:
        if self._fatal is None:
            self._fatal = error
            log.critical("device %d lost: %s", rt.index, error)
            for identity in list(self.sessions):
                self._send(identity, [proto.encode_error(ErrorCode.DEVICE_LOST, f"device {rt.index} lost: {error}")])
            self.stop()

    async def _shutdown(self) -> None:
        for identity in list(self.sessions):
            self._end_session(identity, STOPPING)
        for name in self.graph_store.names():
            family = self.graph_store.unpublish(name, by="")
            family.builder = None
            _drop_family(family, self.residents)
        self.residents.clear()
        for rt in self.runtimes:
            await rt.close(self._close_timeout)

    # ------------------------------------------------------------------ operating it

    def status_line(self) -> str:
        """systemd's STATUS=: devices, sessions, queued work and health, in one line."""
        queued = sum(rt.encoded for rt in self.runtimes)
        in_flight = sum(rt.ledger.in_flight for rt in self.runtimes)
        state = "stopping (draining)" if self.stopping else "serving"
        return (
            f"{state}: {len(self.runtimes)} device(s), {len(self.sessions)} session(s), {queued} op(s) queued, "
            f"{in_flight} submission(s) in flight; {self.assess().summary()}"
        )

    def status(self) -> dict[str, Any]:
        """Everything `gpud status`, `gpud stats` and the metrics endpoint show (msgpack-safe)."""
        now = time.monotonic()
        health = self.assess(now)
        devices = [_device_status(rt, stall) for rt, stall in zip(self.runtimes, health.stalled, strict=True)]
        sessions = []
        for session in list(self.sessions.values())[:LIST_CAP]:
            name, pid, opened = self._clients.get(session.id, ("?", 0, now))
            sessions.append(
                {
                    "id": session.id,
                    "client": name,
                    "pid": pid,
                    "device": session.device,
                    "connected_s": round(now - opened, 3),
                    "idle_s": round(max(0.0, now - session.last_seen), 3),
                    "memory_bytes": sum(session.private_bytes),
                    "handles": len(session.handles),
                    "kernels": len(session.kernels),
                    "graphs": len(session.graphs),
                    "ops": session.ops_done,
                    "requests_in_flight": session.requests_in_flight,
                }
            )
        return {
            "version": __version__,
            "protocol": proto.PROTOCOL_VERSION,
            "pid": os.getpid(),
            "address": self.config.address,
            "config_file": str(self.config_file or ""),
            "backend": self.runtimes[0].device.kind if self.runtimes else "",
            "state": "stopping" if self.stopping else "serving",
            "uptime_s": round(now - self.started_at, 3),
            "health": {
                "healthy": health.healthy,
                "problems": list(health.problems),
                "stall_s": self.config.health_stall_s,
            },
            "devices": devices,
            "session_count": len(self.sessions),
            "sessions": sessions,
            "resident_count": len(self.residents),
            "residents": self._residents_status(),
            "graph_count": len(self.graph_store),
            "graphs": self._graphs_status(),
            "counters": self._counters(),
            "outboxes": self._outboxes.stats() if self._outboxes is not None else {},
            "sessionless_peers": len(self._budget),  # peers without a session whose budget is remembered
        }

    def _counters(self) -> dict[str, int]:
        replies = self._outboxes.sessionless_dropped if self._outboxes is not None else 0
        return {**self.counters, "sessionless_dropped": self._budget.dropped, "sessionless_replies_dropped": replies}

    def _client_of(self, session_id: str) -> str:
        name, pid, _ = self._clients.get(session_id, ("", 0, 0.0))
        return f"{name} (pid {pid})" if name or pid else "(gone)"

    def _residents_status(self) -> list[dict[str, Any]]:
        by_name: dict[str, Tensor] = self.residents._by_name  # read-only view of the store
        out = []
        for name in self.residents.names()[:LIST_CAP]:
            tensor = by_name[name]
            out.append(
                {
                    "name": name,
                    "dtype": tensor.dtype,
                    "shape": list(tensor.shape),
                    "nbytes": tensor.nbytes,
                    "device": tensor.device,
                    "mode": tensor.mode,
                    "publisher": self._client_of(tensor.publisher),
                    "refs": tensor.refs,
                }
            )
        return out

    def _graphs_status(self) -> list[dict[str, Any]]:
        by_name: dict[str, Any] = self.graph_store._by_name  # read-only view of the store
        out = []
        for name in self.graph_store.names()[:LIST_CAP]:
            family = by_name[name]
            out.append(
                {
                    "name": name,
                    "device": family.device,
                    "builder": self._client_of(family.owner),
                    "nbytes": family.nbytes,
                    "instances": len(family.instances),
                    "refs": family.refs,
                }
            )
        return out


def _device_status(rt: DeviceRuntime, stalled: float) -> dict[str, Any]:
    """One device for `status()`: gauges at the top level, monotonic counters under "counters"."""
    stats = rt.stats()
    info = rt.info()
    flushes = int(stats.get("flushes", 0))
    cache, up, down = stats["program_cache"], stats["upload_staging"], stats["download_staging"]
    counters = {k: v for k, v in stats.items() if type(v) in (int, float) and k not in _GAUGE_KEYS}
    counters |= {
        "kernel_cache_hits": cache["hits"],
        "kernel_cache_misses": cache["misses"],
        "kernel_cache_evictions": cache.get("evictions", 0),
        "upload_staging_hits": up.get("hits", 0),
        "upload_staging_misses": up.get("misses", 0),
        "upload_staging_waits": up["exhausted_waits"],
        "download_staging_hits": down.get("hits", 0),
        "download_staging_misses": down.get("misses", 0),
        "download_staging_waits": down["exhausted_waits"],
    }
    latencies = sorted(rt.readback_latencies)
    return {
        "index": rt.index,
        "name": str(info.get("name", "")),
        "backend": rt.device.kind,
        "memory_in_use": rt.memory_in_use,
        "memory_total": info.get("memory_total"),
        "memory_free": info.get("memory_free"),
        "live_buffers": rt.live_buffers,
        "sessions": rt.sessions,
        "pending_ops": rt.encoded,
        "in_flight": rt.ledger.in_flight,
        "stalled_s": round(stalled, 3),
        "dispatches_per_flush": round(stats.get("dispatches", 0) / flushes, 2) if flushes else 0.0,
        "staging_bytes": up["bytes"] + down["bytes"],
        "kernels_cached": cache["size"],
        "readback_latency_s": {q: _percentile(latencies, float(q)) for q in ("0.5", "0.9", "0.99")}
        if latencies
        else {},
        "counters": counters,
    }


_GAUGE_KEYS = frozenset({"index", "memory_in_use", "live_buffers", "in_flight"})


def _percentile(ordered: list[float], q: float) -> float:
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def _drop_family(family: Any, residents: ResidentStore) -> None:
    """A published graph at shutdown: release what it holds (its sessions are gone)."""
    from gpud.session import graph_ops

    graph_ops.release(family, residents)


def _describe(info: dict[str, Any]) -> str:
    return ", ".join(f"{k}={v}" for k, v in info.items() if k not in ("index",))


def _round_robin(messages: list[tuple[bytes, Any]]) -> Iterator[tuple[bytes, Any]]:
    """Interleave messages of different peers, keeping each peer's own order."""
    queues: OrderedDict[bytes, list[Any]] = OrderedDict()
    for identity, message in messages:
        queues.setdefault(identity, []).append(message)
    while queues:
        for identity in list(queues):
            pending = queues[identity]
            yield identity, pending.pop(0)
            if not pending:
                del queues[identity]
