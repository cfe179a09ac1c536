"""One session's fault is never another's: what used to end, stall or bloat the daemon for everyone.

Each test names the defect it guards against; each runs on every backend the `daemon` fixture has
unless the defect is backend-specific.
"""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import anyio
import numpy as np
import pytest
import zmq
from rawpeer import RawPeer
from support import (
    Daemon,
    assert_close,
    axpb,
    check_well_behaved,
    device_memory,
    occupy,
    ref_axpb,
    run_axpb,
    wait_for_memory,
)

import gpud_client
import gpud_protocol as proto
from gpud.testing import spawn
from gpud_client import Busy, DaemonLost, InvalidArgument, SessionLost, u32
from gpud_protocol import ErrorCode, Opcode


async def test_the_same_tensor_passed_twice_fails_that_op_only(gpu: gpud_client.Client, address: str) -> None:
    """Regression: x bound as both the read and the read_write argument made wgpu refuse the whole
    submission, which the daemon took for a lost device and exited (3) for everyone."""
    k = await axpb(gpu)
    x = gpu.tensor(np.arange(256, dtype=np.float32))
    async with gpud_client.connect(address) as bystander:
        kb = await axpb(bystander)
        bx, by = bystander.tensor(np.ones(256, np.float32)), bystander.empty(256)
        run_axpb(bystander, kb, bx, by, 2.0, 1.0)  # queued in the same drain as the bad dispatch
        gpu.dispatch(k, 4, [x, x, 2.0, 1.0, u32(256)])
        if gpu.backend == "webgpu":
            with pytest.raises(InvalidArgument, match="same tensor") as info:
                await x.numpy()
            assert info.value.op == "dispatch"
        assert_close(await by.numpy(), np.full(256, 3.0, np.float32))
    await check_well_behaved(gpu)


async def test_a_dispatch_without_its_arguments_is_refused(gpu: gpud_client.Client) -> None:
    """Regression: no arguments to a kernel that declares bindings skipped set_bind_group, and the
    failed submit ended the daemon."""
    k = await axpb(gpu)
    y = gpu.tensor(np.zeros(8, np.float32))
    gpu.dispatch(k, 1, [])
    with pytest.raises(InvalidArgument, match=r"takes|arguments") as info:
        await y.numpy()
    assert info.value.op == "dispatch"
    await check_well_behaved(gpu, k)


async def test_scalars_are_checked_against_the_kernel(gpu: gpud_client.Client) -> None:
    """Regression: an int where the kernel wants f32 arrived as 3e-45; extra scalars were ignored."""
    k = await axpb(gpu)
    x, y = gpu.tensor(np.ones(64, np.float32)), gpu.empty(64)
    for args in ([x, y, 2, 1.0, u32(64)], [x, y, 2.0, 1.0, u32(64), 7], [x, y, 2.0, 1.0, 64]):
        gpu.dispatch(k, 1, args)
        with pytest.raises(InvalidArgument, match=r"scalars|arguments|parameter"):
            await y.numpy()
    await check_well_behaved(gpu, k)


async def test_a_heavy_submission_never_stalls_other_sessions(daemon: Daemon) -> None:
    """Regression: lavapipe's queue.submit blocked the event loop while earlier work ran; another
    client's ping waited 26 s and a third raised DaemonLost. Now the loop answers at once."""
    async with gpud_client.connect(daemon.address) as heavy, gpud_client.connect(daemon.address) as other:
        await check_well_behaved(other)
        y = await occupy(heavy, 3.0)
        latencies = []
        for _ in range(10):
            t0 = time.perf_counter()
            await other.stats()  # a request that needs no GPU work
            latencies.append(time.perf_counter() - t0)
            await anyio.sleep(0.05)
        assert max(latencies) < 1.0, f"stats took {max(latencies):.3f} s while another session's work ran"
        await heavy.sync()
        assert (await y.numpy()).shape == (4096,)
        await check_well_behaved(other)


async def test_sigterm_is_handled_promptly_during_heavy_work() -> None:
    with spawn.daemon("webgpu", extra_args=("--drain-timeout-s", "1")) as (address, proc):
        async with gpud_client.connect(address) as gpu:
            await occupy(gpu, 8.0)
            t0 = time.monotonic()
            proc.send_signal(signal.SIGTERM)
            with pytest.raises((DaemonLost, Busy)):  # Busy: the drain refuses new requests
                for _ in range(200):
                    await gpu.stats()
                    await anyio.sleep(0.05)
        await asyncio.to_thread(proc.wait, 15)
        assert time.monotonic() - t0 < 6, "SIGTERM took too long"
        assert proc.returncode == 0


_KILLED_IN_SYNC = textwrap.dedent(
    """
    import asyncio, sys
    import numpy as np
    import gpud_client
    sys.path.insert(0, sys.argv[2])
    from support import occupy

    async def main(address):
        async with gpud_client.connect(address) as gpu:
            gpu.tensor(np.ones(2 << 20, dtype=np.float32))  # 8 MiB
            await occupy(gpu, 2.0)
            print("syncing", flush=True)
            await gpu.sync()

    asyncio.run(main(sys.argv[1]))
    """
)


async def test_a_client_killed_while_awaiting_sync_gets_its_memory_back(private_daemon: Daemon) -> None:
    """Regression: its session ended inside the completion of the submission its buffers used; the
    frees registered then never ran and 8 MiB stayed held forever."""
    address = private_daemon.address
    baseline = await device_memory(address)
    for _ in range(3):
        victim = await asyncio.create_subprocess_exec(
            sys.executable,
            "-c",
            _KILLED_IN_SYNC,
            address,
            str(Path(__file__).parents[1]),
            stdout=asyncio.subprocess.PIPE,
        )
        assert victim.stdout is not None
        with anyio.fail_after(60):
            assert (await victim.stdout.readline()).strip() == b"syncing"
        victim.send_signal(signal.SIGKILL)
        await victim.wait()
    await wait_for_memory(address, baseline, timeout=30)
    private_daemon.assert_alive()


async def test_a_peer_that_never_reads_its_replies_is_bounded_and_ended() -> None:
    """Regression: 256 MiB of unread readbacks grew the daemon's memory without bound (the kernel
    OOM-killed it). Now the bytes held for a peer are bounded, and a peer that does not read loses
    its session after a lease."""
    args = ("--lease-s", "1", "--session-reply-bytes", str(32 << 20))
    with spawn.daemon("webgpu", extra_args=args) as (address, proc):
        baseline = await device_memory(address)
        rss_before = _rss(proc.pid)
        peer = RawPeer(address)
        peer.sock.setsockopt(zmq.RCVHWM, 1)
        try:
            await peer.hello()
            size = 4 << 20
            await peer.batch([[Opcode.ALLOC, peer.next_seq(), 1, "uint8", [size], 0]])
            for _ in range(64):  # 256 MiB of readbacks, never read
                await peer.batch([[Opcode.READBACK, peer.next_seq(), 1] for _ in range(1)])
            async with gpud_client.connect(address) as other:
                for _ in range(20):
                    await check_well_behaved(other)
                    await anyio.sleep(0.1)
                other.trim()  # its freed tensors, pooled for reuse, leave too: only the peer's memory is in question
                deadline = time.monotonic() + 15
                while (await other.stats())["device"]["memory_in_use"] > baseline["memory_in_use"]:
                    assert time.monotonic() < deadline, "the non-reading session was not ended"
                    await anyio.sleep(0.2)
            growth = _rss(proc.pid) - rss_before
            assert growth < 200 << 20, f"daemon RSS grew {growth >> 20} MiB for a peer that reads nothing"
        finally:
            peer.close()
        await wait_for_memory(address, baseline)
        assert proc.poll() is None


def _rss(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


async def test_a_blocked_event_loop_keeps_its_session(private_daemon: Daemon) -> None:
    """Regression: heartbeats were an asyncio task; a client tokenizing for 5 s lost its session.
    Beats now come from a thread (the daemon's lease here is 1 s)."""
    async with gpud_client.connect(private_daemon.address) as gpu:
        k = await axpb(gpu)
        x = gpu.tensor(np.arange(64, dtype=np.float32))
        time.sleep(3.5)  # the loop is blocked: no task runs
        y = gpu.empty(64)
        run_axpb(gpu, k, x, y, 2.0, 0.0)
        assert_close(await y.numpy(), ref_axpb(np.arange(64, dtype=np.float32), 2.0, 0.0))


async def test_an_ended_session_raises_session_lost(private_daemon: Daemon) -> None:
    async with gpud_client.connect(private_daemon.address) as gpu:
        x = gpu.tensor(np.ones(4, np.float32))
        await x.numpy()
        beats = gpu._connection._beats
        assert beats is not None
        beats.stop()  # as if the process had died: no beats, no messages
        time.sleep(3.0)
        with pytest.raises(SessionLost):
            await x.numpy()
        with pytest.raises(SessionLost):
            gpu.empty(4)


async def test_connect_to_a_socket_nobody_listens_on_fails_fast(tmp_path: Path) -> None:
    """Regression: a stale socket file made connect() wait 10 s before DaemonLost."""
    path = tmp_path / "stale.sock"
    stale = socket.socket(socket.AF_UNIX)
    stale.bind(str(path))
    stale.close()  # the file stays, nothing listens
    t0 = time.monotonic()
    with pytest.raises(DaemonLost, match="nothing listens"):
        async with gpud_client.connect(f"ipc://{path}"):
            pass
    assert time.monotonic() - t0 < 1.0


@pytest.mark.parametrize(
    ("args", "config", "message"),
    [
        (("--config", "{tmp}/missing.toml"), None, "missing.toml"),
        (("--config", "{tmp}/gpud.toml"), '[gpud]\nlease_s = "five"\n', "lease_s"),
        (("--config", "{tmp}/gpud.toml"), "[gpud]\nlease = 5\n", "lease"),
        (("--config", "{tmp}/gpud.toml"), "[gpu]\nlease_s = 5\n", "gpu"),
        (("--config", "{tmp}/gpud.toml"), "[gpud]\nsession_memory_bytes = -5\n", "session_memory_bytes"),
        (("--config", "{tmp}/gpud.toml"), "[gpud\n", "TOML"),
        (("--lease-s", "five"), None, "lease-s"),
        (("--backend", "nope"), None, "backend"),
    ],
)
def test_start_up_problems_are_one_line_and_exit_2(
    tmp_path: Path, args: tuple[str, ...], config: str | None, message: str
) -> None:
    """Regression: these printed tracebacks, or started serving and died later."""
    if config is not None:
        (tmp_path / "gpud.toml").write_text(config)
    socket_path = tmp_path / "gpud.sock"
    argv = [a.format(tmp=tmp_path) for a in args]
    cmd = [sys.executable, "-m", "gpud", "serve", "--address", f"ipc://{socket_path}", "--backend", "webgpu", *argv]
    if "--backend" in argv:
        cmd = [c for i, c in enumerate(cmd) if not (c == "webgpu" and cmd[i - 1] == "--backend")]
        cmd.remove("--backend")
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr
    assert message in result.stderr
    assert not socket_path.exists()


def test_cuda_backend_without_cuda_python_is_one_line(tmp_path: Path) -> None:
    pytest.importorskip("wgpu")
    env = {**os.environ, "PYTHONPATH": str(tmp_path)}  # a cuda package that cannot import
    (tmp_path / "cuda").mkdir()
    (tmp_path / "cuda" / "__init__.py").write_text("raise ImportError('no cuda here')\n")
    cmd = [sys.executable, "-m", "gpud", "serve", "--address", f"ipc://{tmp_path}/g.sock", "--backend", "cuda"]
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=60, env=env)
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert "cuda" in result.stderr and len(result.stderr.strip().splitlines()) == 1


async def test_unattributable_errors_name_the_problem(address: str) -> None:
    peer = RawPeer(address)
    try:
        await peer.send(proto.encode_batch(b"", 0, 0))
        header = await peer.error()
        assert header["code"] == ErrorCode.SESSION and "hello" in header["msg"]
    finally:
        peer.close()
