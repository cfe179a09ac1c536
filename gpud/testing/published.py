"""A step graph every session shares by name: opened where it is published, else built and published."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import gpud_client


async def published_step(
    gpu: gpud_client.Client, name: str, build: Callable[[], Awaitable[gpud_client.Step]], *, share: bool = False
) -> gpud_client.Step:
    """The step graph published as `name`, opened; else `build()` and publish it. When another session
    publishes it first, keep ours, or with `share` free it and open theirs (one graph for everyone)."""
    try:
        return await gpu.open_graph(name)
    except gpud_client.NotFound:
        pass
    step = await build()
    try:
        gpu.publish_graph(step, name)
        await gpu.flush()
    except gpud_client.AlreadyExists:
        if share:
            step.free()
            step = await gpu.open_graph(name)
    return step
