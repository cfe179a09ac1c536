"""Where a readback's round trip goes: the stamps the client and the daemon (started with --trace) put on
it, and their medians by stage."""

from __future__ import annotations

import statistics
from typing import NamedTuple


class Trace(NamedTuple):
    """perf_counter stamps of one readback (same clock in every process of a host)."""

    sent: float  # client: batch handed to ZeroMQ
    received: float  # daemon: message read from the socket
    executed: float  # daemon: the readback's copy encoded
    flushed: float  # daemon: the command buffer submitted
    completed: float  # daemon: the copy completed, reply about to be sent
    replied: float  # client: reply read from the socket
    resumed: float  # client: the awaiting task resumed

    @staticmethod
    def median_stages_us(traces: list[Trace]) -> dict[str, float]:
        """Where round trips go: each stage's median over `traces`, in microseconds."""
        stages = {
            "client_to_daemon": [t.received - t.sent for t in traces],
            "daemon_decode_execute": [t.executed - t.received for t in traces],
            "until_flush": [t.flushed - t.executed for t in traces],
            "gpu_and_completion": [t.completed - t.flushed for t in traces],
            "daemon_to_client": [t.replied - t.completed for t in traces],
            "client_resume": [t.resumed - t.replied for t in traces],
        }
        return {name: 1e6 * statistics.median(values) for name, values in stages.items() if values}
