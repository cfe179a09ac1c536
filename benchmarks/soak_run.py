"""The soak's supervisor: K client processes (benchmarks.soak_client), their events, the kills.

One slot per client; a slot's process is replaced (the next generation) when it is killed or fails.
About once every `kill_every_s` a random slot's process gets SIGKILL and a replacement starts at
once; it must connect again and go on. Every other way a client ends before the stop is a failure.
"""

from __future__ import annotations

import contextlib
import multiprocessing as mp
import os
import random
import signal
import subprocess
import time
from collections import Counter
from collections.abc import Callable
from multiprocessing.connection import Connection, wait
from typing import Any

from benchmarks.soak_client import Spec, client_process

KILL_EVERY_S = 60.0
STOP_TIMEOUT_S = 120.0  # for every client to finish its activity and clean up after a stop


class Slot:
    def __init__(self, process: Any, pipe: Connection, generation: int) -> None:
        self.process, self.pipe, self.generation = process, pipe, generation
        self.open = True  # the pipe: False once it reported end of file
        self.killed = False
        self.stopped = False  # said "stopped" after a stop


class Supervisor:
    def __init__(self, spec: Spec, seconds: float) -> None:
        """`spec`: what every client gets, its slot and generation aside."""
        self.spec, self.k, self.seconds = spec, spec.clients, seconds
        self.kill_every_s = min(KILL_EVERY_S, max(3.0, seconds / 4))
        self.ctx = mp.get_context("spawn")
        self.slots: dict[int, Slot] = {}
        self.t0 = time.monotonic()
        self.activities: Counter[str] = Counter()
        self.activity_s: Counter[str] = Counter()
        self.expected_events: Counter[str] = Counter()
        self.errors: list[dict[str, Any]] = []
        self.kills: list[dict[str, Any]] = []
        self.reconnects = 0
        self.daemon_exit: int | None = None

    def elapsed(self) -> float:
        return time.monotonic() - self.t0

    def _start(self, slot: int, generation: int) -> None:
        mine, theirs = self.ctx.Pipe(duplex=True)
        spec = self.spec._replace(slot=slot, generation=generation)
        process = self.ctx.Process(target=client_process, args=(spec, theirs), name=f"soak-client-{slot}", daemon=True)
        process.start()
        theirs.close()
        self.slots[slot] = Slot(process, mine, generation)

    def _error(self, slot: int, generation: int, activity: str, text: str) -> None:
        t = round(self.elapsed(), 3)
        self.errors.append({"t_s": t, "slot": slot, "generation": generation, "activity": activity, "error": text})
        print(f"  client {slot}.{generation} failed in {activity}: {text.splitlines()[0]}")

    def _receive(self, timeout: float) -> None:
        by_pipe = {id(slot.pipe): (index, slot) for index, slot in self.slots.items() if slot.open}
        ready = wait([slot.pipe for _, slot in by_pipe.values()], timeout=max(0.0, timeout))
        for pipe in ready:
            index, slot = by_pipe[id(pipe)]
            try:
                message: tuple[Any, ...] = slot.pipe.recv()
            except (EOFError, OSError, ValueError):  # gone (a killed client may leave half a message)
                slot.open = False
                continue
            kind = message[0]
            if kind == "did":
                self.activities[message[1]] += 1
                self.activity_s[message[1]] += message[2]
            elif kind == "expected":
                self.expected_events[message[1]] += 1
            elif kind == "error":
                self._error(index, slot.generation, message[1], message[2])
            elif kind == "started" and slot.generation > 0:
                self.reconnects += 1
            elif kind == "stopped":
                slot.stopped = True

    def _check_exits(self, stopping: bool) -> None:
        for index, slot in list(self.slots.items()):
            code = slot.process.exitcode
            if code is None or slot.killed or stopping:
                continue
            self._receive(0.0)  # its last words first
            if not any(e["slot"] == index and e["generation"] == slot.generation for e in self.errors):
                self._error(index, slot.generation, "exit", f"the client exited with status {code} on its own")
            slot.pipe.close()
            self._start(index, slot.generation + 1)

    def _kill(self) -> None:
        index = random.randrange(self.k)
        slot = self.slots[index]
        if slot.process.exitcode is not None:
            return
        os.kill(slot.process.pid, signal.SIGKILL)
        slot.killed = True
        slot.process.join(10)
        slot.pipe.close()
        self.kills.append({"t_s": round(self.elapsed(), 3), "slot": index, "generation": slot.generation})
        self._start(index, slot.generation + 1)

    def run(self, on_sample: Callable[[float], None], sample_s: float, daemon: subprocess.Popen[bytes]) -> None:
        """Run the clients for `seconds`, calling `on_sample(t)` every `sample_s`; then stop them."""
        self.t0 = time.monotonic()
        for index in range(self.k):
            self._start(index, 0)
        next_sample = sample_s
        next_kill = self.kill_every_s * random.uniform(0.5, 1.5)
        while (now := self.elapsed()) < self.seconds:
            self._receive(min(next_sample, next_kill, self.seconds) - now)
            if daemon.poll() is not None:
                self.daemon_exit = daemon.returncode
                break
            self._check_exits(stopping=False)
            now = self.elapsed()
            if now >= next_sample:
                on_sample(now)
                next_sample += sample_s
                print(f"  {now:7.0f} s: {sum(self.activities.values())} activities, {len(self.kills)} kills, "
                      f"{len(self.errors)} errors")  # fmt: skip
            if now >= next_kill and self.k > 0:
                self._kill()
                next_kill = now + self.kill_every_s * random.uniform(0.5, 1.5)
        self._stop()

    def _stop(self) -> None:
        for slot in self.slots.values():
            with contextlib.suppress(OSError, ValueError):
                slot.pipe.send("stop")
        deadline = time.monotonic() + STOP_TIMEOUT_S
        while time.monotonic() < deadline and any(s.process.exitcode is None for s in self.slots.values()):
            self._receive(0.5)
        self._receive(0.0)
        for index, slot in self.slots.items():
            if slot.process.exitcode is None:
                slot.process.kill()
                self._error(index, slot.generation, "stop", f"did not stop within {STOP_TIMEOUT_S:g} s")
            elif not slot.stopped and not any(
                e["slot"] == index and e["generation"] == slot.generation for e in self.errors
            ):
                self._error(index, slot.generation, "stop", f"exited with {slot.process.exitcode} without stopping")
            slot.process.join(10)
            slot.pipe.close()

    def report(self) -> dict[str, Any]:
        return {
            "seconds": round(self.elapsed(), 3),
            "kill_every_s": self.kill_every_s,
            "activities": dict(self.activities),
            "activity_mean_s": {k: self.activity_s[k] / n for k, n in self.activities.items()},
            "kills": len(self.kills),
            "kill_log": self.kills,
            "reconnects": self.reconnects,
            "expected": dict(self.expected_events),
            "errors": self.errors,
            "daemon_exit": self.daemon_exit,
        }

    def failures(self) -> list[str]:
        return [f"client {e['slot']}.{e['generation']}, {e['activity']}: {e['error']}" for e in self.errors]
