"""A process per device (`--process-per-device`) on two fake devices: the front redirects each hello to
a device's worker, the client follows, each worker reports its device by the front's numbering, a
session keeps to its device, the decode benchmark's weights go once to each worker, and the front stops
its workers (and itself) on a signal or a lost worker."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import msgpack
import numpy as np
import pytest
from rawpeer import RawPeer
from support import assert_close, axpb, ref_axpb, run_axpb

import gpud_client
import gpud_protocol as proto
from gpud.service import admin
from gpud.testing import decoding, spawn
from gpud.testing.transformer_weights import CONFIGS, Weights, stacked_weight
from gpud_client import InvalidArgument, NotFound

ARGS = ("--process-per-device", "--devices", "0,1", "--lease", "2")


@pytest.fixture(scope="module")
def front() -> Iterator[str]:
    with spawn.daemon("fake", extra_args=ARGS) as (address, proc):
        yield address
        assert proc.poll() is None, f"the front exited with {proc.returncode}"


def _gone(pid: int, timeout: float = 20.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.05)
    return False


async def test_a_session_on_device_1_runs_there_and_says_so(front: str) -> None:
    async with gpud_client.connect(front, device=1) as gpu:
        assert gpu.device == 1 and [d["index"] for d in gpu.devices] == [1]
        assert gpu.welcome["process_per_device"] is True
        assert gpu._connection.address.endswith(".dev1")  # the worker's socket, not the front's
        k = await axpb(gpu)
        data = np.arange(1000, dtype=np.float32)
        x, y = gpu.tensor(data), gpu.empty(1000)
        assert x.device == y.device == 1
        run_axpb(gpu, k, x, y, 2.0, 1.0)
        assert_close(await y.numpy(), ref_axpb(data, 2.0, 1.0))
        stats = await gpu.stats()
        assert stats["session"]["device"] == 1 and stats["device"]["index"] == 1
        gpu.publish(x, "front-resident")
        (listed,) = await gpu.residents("front-resident")
        assert listed.device == 1
        status = admin.query(front)
        assert [d["index"] for d in status["devices"]] == [0, 1]
        assert [s["device"] for s in status["sessions"]] == [1]
        assert [(r["name"], r["device"]) for r in status["residents"]] == [("front-resident", 1)]
        workers = status["workers"]
        assert [(w["device"], w["session_count"]) for w in workers] == [(0, 0), (1, 1)]
        assert all(w["address"].startswith(front + ".dev") and w["pid"] > 0 for w in workers)
        assert "workers: 2" in admin.format_status(status)
        assert admin.format_stats(status)


async def test_a_session_without_a_device_goes_to_the_less_loaded_worker(front: str) -> None:
    async with gpud_client.connect(front, device=0) as first, gpud_client.connect(front) as second:
        assert (first.device, second.device) == (0, 1)
        async with gpud_client.connect(front) as third, gpud_client.connect(front) as fourth:
            assert sorted([third.device, fourth.device]) == [0, 1]


async def test_another_device_is_refused_clearly(front: str) -> None:
    async with gpud_client.connect(front, device=1) as gpu:
        elsewhere = gpu.empty(4, device=0)
        with pytest.raises(InvalidArgument, match=r"process per device \(process_per_device\)") as info:
            await elsewhere.numpy()
        assert info.value.op == "alloc"
        assert (await gpu.tensor(np.ones(4, np.float32)).numpy()).sum() == 4  # the session goes on
    with pytest.raises(InvalidArgument, match="no device 2: this daemon has 2"):
        async with gpud_client.connect(front, device=2):
            pass
    worker_1 = admin.query(front)["workers"][1]["address"]
    with pytest.raises(InvalidArgument, match="process_per_device"):
        async with gpud_client.connect(worker_1, device=0):  # straight to a worker, naming another device
            pass


async def test_the_front_serves_no_session(front: str) -> None:
    peer = RawPeer(front)
    try:
        await peer.batch([])
        error = await peer.error()
        assert "process_per_device" in error["msg"]
        header = await peer.hello()
        assert header["t"] == "redirect" and header["address"].startswith(front + ".dev")
    finally:
        peer.close()


async def test_hostile_peers_at_the_front_get_typed_errors_and_harm_nobody(front: str) -> None:
    """Whatever a peer sends the front (garbage, a non-map, unknown and server-only messages, hellos of
    another version or naming a device it lacks or not as an integer, frames beside a hello, ops) is
    answered with a typed error or a redirect, never INTERNAL, and the front redirects and the workers
    serve a client as before."""
    peer = RawPeer(front)
    sent = [
        b"\xc1 garbage",
        os.urandom(300),
        msgpack.packb([1, 2, 3]),
        msgpack.packb({"t": "nope"}),
        msgpack.packb({"t": "redirect", "address": "ipc:///tmp/elsewhere", "device": 0}),
        msgpack.packb({"t": "hello", "v": 999, "name": "x", "pid": 1}),
        msgpack.packb({"t": "hello", "v": proto.PROTOCOL_VERSION, "name": "x", "pid": 1, "device": 7}),
        msgpack.packb({"t": "hello", "v": proto.PROTOCOL_VERSION, "name": "x", "pid": 1, "device": "1"}),
        msgpack.packb({"t": "hello", "v": proto.PROTOCOL_VERSION, "name": "x", "pid": 1, "device": -1}),
        msgpack.packb({"t": "hello", "v": proto.PROTOCOL_VERSION, "name": "x" * 100_000, "pid": 1}),
    ]
    try:
        for message in sent:
            await peer.send(message)
            header, _ = await peer.recv()
            assert header["t"] in ("error", "redirect"), (message[:40], header)
            if header["t"] == "error":
                assert header["code"] != int(proto.ErrorCode.INTERNAL), (message[:40], header)
        await peer.send(msgpack.packb({"t": "hello", "v": proto.PROTOCOL_VERSION, "name": "x", "pid": 1}), b"extra")
        header, _ = await peer.recv()
        assert header["t"] == "error" and header["code"] != int(proto.ErrorCode.INTERNAL), header
    finally:
        peer.close()
    async with gpud_client.connect(front) as gpu:
        k, data = await axpb(gpu), np.arange(100, dtype=np.float32)
        x, y = gpu.tensor(data), gpu.empty(100)
        run_axpb(gpu, k, x, y, 2.0, 1.0)
        assert_close(await y.numpy(), ref_axpb(data, 2.0, 1.0))


async def _decode_weights_per_device(address: str, per_device: bool) -> None:
    """`gpud bench decode --devices all`'s weights (gpud.testing.decoding): a copy published per device
    from a session there, client 3 (device 1 of the round robin) reading device 1's, all unpublished."""
    config, prefix, seed = CONFIGS["tiny"], decoding.new_prefix(), 3
    names = {d: Weights.names(config, decoding.device_prefix(prefix, d, 2)) for d in (0, 1)}
    published = await decoding.publish(address, "tiny", prefix, seed, devices=2)
    assert published["devices"] == 2 and published["weights_memory"] >= 2 * config.parameters()
    ours = [(r["name"], r["device"]) for r in admin.query(address)["residents"] if r["name"].startswith(prefix)]
    assert sorted(ours) == sorted((name, d) for d in (0, 1) for name in names[d])
    device = decoding.client_device(3, 2)
    async with gpud_client.connect(address, device=device) as gpu:
        assert gpu.device == device == 1
        assert gpu._connection.address.endswith(".dev1") == per_device
        weights = await Weights.open(gpu, config, decoding.device_prefix(prefix, 3, 2))
        assert weights["embed"].device == 1 and weights["embed"].mode == "ro"
        want = stacked_weight(config, "embed", (config.vocab, config.hidden), seed)
        np.testing.assert_array_equal(await weights["embed"].numpy(), want)
        if per_device:  # device 0's copy lives in the other worker
            with pytest.raises(NotFound):
                await gpu.open(names[0][0])
        else:
            assert (await gpu.open(names[0][0])).device == 0
    await decoding.unpublish(address, "tiny", prefix, devices=2)
    assert not [r for r in admin.query(address)["residents"] if r["name"].startswith(prefix)]


async def test_decode_weights_go_once_to_each_worker(front: str) -> None:
    await _decode_weights_per_device(front, per_device=True)


async def test_decode_weights_per_device_in_one_process() -> None:
    with spawn.daemon("fake", extra_args=("--devices", "0,1")) as (address, _proc):
        await _decode_weights_per_device(address, per_device=False)


@pytest.mark.parametrize("how", ["sigterm", "worker killed"])
def test_the_front_and_its_workers_stop_together(how: str) -> None:
    with spawn.daemon("fake", extra_args=ARGS) as (address, proc):
        pids = [w["pid"] for w in admin.query(address)["workers"]]
        if how == "sigterm":
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(timeout=30) == 0
        else:
            os.kill(pids[0], signal.SIGKILL)
            assert proc.wait(timeout=30) != 0
        assert all(_gone(pid) for pid in pids)
        log = (Path(address[len("ipc://") :]).parent / "daemon.log").read_text()
        assert ("exited with -9: stopping the others" in log) == (how == "worker killed"), log[-3000:]


def test_one_device_or_tcp() -> None:
    with spawn.daemon("fake", extra_args=("--process-per-device", "--devices", "1")) as (address, _proc):
        got = asyncio.run(_welcome_device(address))
        assert got == (0, False)  # served by the one process, as without the setting
    cmd = [sys.executable, "-m", "gpud", "serve", "--no-config", "--backend", "fake", "--process-per-device"]
    done = subprocess.run([*cmd, "--address", "tcp://127.0.0.1:0", "--insecure-tcp"], capture_output=True, timeout=60)
    assert done.returncode == 2 and b"process_per_device serves ipc:// addresses only" in done.stderr


async def _welcome_device(address: str) -> tuple[int, bool]:
    async with gpud_client.connect(address) as gpu:
        return gpu.device, bool(gpu.welcome.get("process_per_device"))
