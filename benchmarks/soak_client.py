"""One client process of `gpud bench soak`: a random mix of everything a client does, until told to stop.

Activities, chosen at random: decode tokens in one of the three modes (a fresh `Decoder` each time:
its caches and activations are allocated and freed), an op-library batch (matmul, add, softmax on
random data, checked against numpy), a replay of a small graph of its own (rebuilt now and then),
and a resident: publish its own under its slot's name and unpublish it, or open another slot's.
Every result is checked. The process talks to its supervisor over one duplex pipe of its own (a
shared multiprocessing.Queue could be left locked by a client killed with SIGKILL): it sends
("did", activity, seconds), ("expected", what) and ("error", activity, text); it reads "stop".
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import traceback
from multiprocessing.connection import Connection
from typing import Any, NamedTuple

import numpy as np

import gpud_client
from gpud.testing.decoding import prompt
from gpud.testing.generation import generate
from gpud.testing.shared_decoder import decoder_for
from gpud.testing.transformer import MODES
from gpud.testing.transformer_weights import CONFIGS, Weights

ACTIVITIES = ("decode", "ops", "replay", "publish", "open")
RESIDENT_FLOATS = (256, 4096, 65536)  # the sizes of the published residents (several size classes)
REBUILD_EVERY = 8  # replays of the small graph between rebuilds, on average
ATOL, RTOL = 1e-4, 1e-4  # of the float64 reference's scale: catches corruption, not rounding


class Spec(NamedTuple):
    address: str
    model: str
    prefix: str  # the run's names: weights, step graph, slot residents
    slot: int
    clients: int  # K: the slots whose residents this one opens
    generation: int  # 0 for the first client of the slot, +1 for each replacement
    tokens: int  # greedy tokens per decode
    expected: dict[int, list[int]]  # prompt seed -> its tokens (the supervisor's baseline)
    activities: tuple[str, ...] = ACTIVITIES  # the mix (fewer: to find which one a growth comes from)
    modes: tuple[str, ...] = MODES  # the decode modes


def slot_name(prefix: str, slot: int) -> str:
    return f"{prefix}slot{slot}"


def resident_data(slot: int, serial: int, n: int) -> np.ndarray[Any, Any]:
    """What slot `slot` publishes the `serial`-th time: [slot, serial, n floats from both]."""
    body = np.random.default_rng([slot, serial]).standard_normal(n).astype(np.float32)
    return np.concatenate([np.array([slot, serial], np.float32), body])


class Worker:
    def __init__(self, gpu: gpud_client.Client, spec: Spec, pipe: Connection) -> None:
        self.gpu, self.spec, self.pipe = gpu, spec, pipe
        self.config = CONFIGS[spec.model]
        self.rng = np.random.default_rng([spec.slot, spec.generation, time.time_ns() & 0xFFFF])
        self.weights: Weights | None = None
        self.serial = 0
        # A killed predecessor may have left the slot's resident published: clean it up first.
        self.leftover = spec.generation > 0
        self.started = time.monotonic()
        self.graph: tuple[gpud_client.Step, gpud_client.Tensor, np.ndarray[Any, Any]] | None = None
        self.replays = 0

    def tell(self, *message: Any) -> None:
        self.pipe.send(message)

    # ------------------------------------------------------------------ decode

    async def decode(self) -> None:
        if self.weights is None:
            self.weights = await Weights.open(self.gpu, self.config, self.spec.prefix)
        mode = self.spec.modes[int(self.rng.integers(len(self.spec.modes)))]
        seed = int(self.rng.choice(list(self.spec.expected)))
        decoder = decoder_for(mode, self.gpu, self.config, self.weights, graph_name=self.spec.prefix + "step")
        try:
            out, _ = await generate(decoder, prompt(seed, self.config), self.spec.tokens, mode)
        finally:
            decoder.free()
        if out[0].tolist() != self.spec.expected[seed]:  # every mode's tokens are exact (decoding.py)
            raise AssertionError(f"decode {mode}, prompt {seed}: {out[0].tolist()} not {self.spec.expected[seed]}")

    # ------------------------------------------------------------------ the op library

    async def ops(self) -> None:
        ops, rng = self.gpu.ops, self.rng
        m, k, n = (int(v) for v in rng.integers((1, 1, 1), (24, 160, 160)))
        a = rng.standard_normal((m, k)).astype(np.float32)
        w = rng.standard_normal((k, n)).astype(np.float32)
        b = rng.standard_normal(n).astype(np.float32)
        x, wt, bt = self.gpu.tensor(a), self.gpu.tensor(w), self.gpu.tensor(b)
        y = ops.matmul(x, wt)
        z = ops.add(y, bt)
        s = ops.softmax(z)
        got_y, got_z, got_s = await y.numpy(), await z.numpy(), await s.numpy()
        for tensor in (x, wt, bt, y, z, s):
            tensor.free()
        ref = a.astype(np.float64) @ w.astype(np.float64)
        scale = np.abs(a.astype(np.float64)) @ np.abs(w.astype(np.float64))
        _close("matmul", got_y, ref, scale)
        _close("add", got_z, got_y.astype(np.float64) + b, np.abs(got_y) + np.abs(b))
        shifted = np.exp(got_z.astype(np.float64) - got_z.max(axis=-1, keepdims=True))
        _close("softmax", got_s, shifted / shifted.sum(axis=-1, keepdims=True), np.ones_like(got_s))

    # ------------------------------------------------------------------ a small replay graph

    async def replay(self) -> None:
        if self.graph is not None and self.rng.random() < 1 / REBUILD_EVERY:
            step, w, _ = self.graph
            step.free()
            w.free()
            self.graph = None
        if self.graph is None:
            self.graph = await self._build()
        step, _, w_host = self.graph
        a = self.rng.standard_normal((4, 32)).astype(np.float32)
        got = (await step.replay(x=a))["y"]
        h = a.astype(np.float64) @ w_host.astype(np.float64)
        e = np.exp(h - h.max(axis=-1, keepdims=True))
        _close("replay", got, e / e.sum(axis=-1, keepdims=True), np.ones_like(got))
        self.replays += 1

    async def _build(self) -> tuple[gpud_client.Step, gpud_client.Tensor, np.ndarray[Any, Any]]:
        w_host = (self.rng.standard_normal((32, 16)) / 8).astype(np.float32)
        w = self.gpu.tensor(w_host)
        g = self.gpu.graph(f"{self.spec.prefix}small")
        x = g.input("x", (4, 32), "float32")
        g.output("y", self.gpu.ops.softmax(self.gpu.ops.matmul(x, w, graph=g), graph=g))
        return await g.build(), w, w_host

    # ------------------------------------------------------------------ residents

    async def publish(self) -> None:
        if not await self._cleaned():
            return
        name = slot_name(self.spec.prefix, self.spec.slot)
        n = int(self.rng.choice(RESIDENT_FLOATS))
        self.serial += 1
        data = resident_data(self.spec.slot, self.serial, n)
        tensor = self.gpu.tensor(data)
        self.gpu.publish(tensor, name, mode="ro" if self.rng.random() < 0.5 else "rw")
        await self.gpu.sync()
        tensor.free()  # the name keeps it
        # Let the others find it for a while (other activities run meanwhile in the other clients).
        await asyncio.sleep(float(self.rng.uniform(0.0, 0.5)))
        self.gpu.unpublish(name)
        await self.gpu.sync()

    async def open(self) -> None:
        others = [s for s in range(self.spec.clients) if s != self.spec.slot] or [self.spec.slot + 1]
        slot = int(self.rng.choice(others))
        try:
            tensor = await self.gpu.open(slot_name(self.spec.prefix, slot))
        except gpud_client.NotFound:
            self.tell("expected", "open: not published now")
            return
        got = await tensor.numpy()
        tensor.free()
        want = resident_data(int(got[0]), int(got[1]), got.size - 2)
        if int(got[0]) != slot or not np.array_equal(got, want):
            raise AssertionError(f"slot {slot}'s resident read back wrong: header {got[:2].tolist()}, size {got.size}")

    async def _cleaned(self) -> bool:
        """True once no leftover of a killed predecessor holds the slot's name."""
        if not self.leftover:
            return True
        self.gpu.unpublish(slot_name(self.spec.prefix, self.spec.slot))
        try:
            await self.gpu.sync()
            self.tell("expected", "publish: a killed predecessor's resident cleaned up")
        except gpud_client.NotFound:
            pass
        except gpud_client.PermissionDenied:
            # read-only, and its publisher's session has not expired yet: it may be a few leases
            lease = float(self.gpu.welcome.get("lease_s", 5.0))
            if time.monotonic() - self.started > 4 * lease + 5:
                raise
            self.tell("expected", "publish: a killed predecessor's read-only resident not yet released")
            return False
        self.leftover = False
        return True

    async def close(self) -> None:
        """At a graceful stop: leave nothing published, free what is ours."""
        lease = float(self.gpu.welcome.get("lease_s", 5.0))
        deadline = time.monotonic() + 4 * lease + 5
        while not await self._cleaned() and time.monotonic() < deadline:
            await asyncio.sleep(lease / 2)
        if self.graph is not None:
            self.graph[0].free()
            self.graph[1].free()
        await self.gpu.sync()


def _close(what: str, got: np.ndarray[Any, Any], ref: np.ndarray[Any, Any], scale: np.ndarray[Any, Any]) -> None:
    if got.shape != ref.shape:
        raise AssertionError(f"{what}: shape {got.shape}, not {ref.shape}")
    err = np.abs(got.astype(np.float64) - ref)
    bound = ATOL * scale + RTOL * np.abs(ref)
    if not np.all(err <= bound):  # NaN fails too
        worst = np.unravel_index(int(np.nanargmax(err - bound)), err.shape) if err.size else ()
        raise AssertionError(f"{what}: wrong at {worst}: {got[worst]!r}, want {ref[worst]!r}")


async def _run(spec: Spec, pipe: Connection) -> None:
    activity = "connect"
    try:
        async with gpud_client.connect(spec.address) as gpu:
            worker = Worker(gpu, spec, pipe)
            worker.tell("started", gpu.session_id)
            while not pipe.poll():
                activity = spec.activities[int(worker.rng.integers(len(spec.activities)))]
                t0 = time.perf_counter()
                await getattr(worker, activity)()
                worker.tell("did", activity, time.perf_counter() - t0)
            activity = "stop"
            await worker.close()
        pipe.send(("stopped",))
    except Exception as exc:
        pipe.send(("error", activity, f"{type(exc).__name__}: {exc}\n{traceback.format_exc(limit=6)}"))
        raise


def client_process(spec: Spec, pipe: Connection) -> None:
    """The target of each client process: its errors go to the supervisor, then it exits with 1."""
    try:
        asyncio.run(_run(spec, pipe))
    except Exception:
        raise SystemExit(1) from None
    finally:
        with contextlib.suppress(OSError):
            pipe.close()
