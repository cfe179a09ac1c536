"""The daemon's per-op benchmark (benchmarks/daemon_ops.py) in small: the real client and op library,
in process, through the decoder and a session on a fake device. What it checks is what the numbers
rest on: the steady decode step's dispatches all come from the session's memo, prepared (no timing)."""

from __future__ import annotations

from support import benchmark

from gpud.testing import bert, transformer, transformer_weights


async def test_a_steady_decode_step_misses_nothing_and_the_other_workloads_run() -> None:
    decode = transformer_weights.Config(2, 32, 2, 1, 16, 64, 64, 32)
    minilm = bert.BertConfig(1, 64, 2, 128, 100, max_positions=16)
    results = await benchmark("daemon_ops").run(
        steps=2, reps=1, profile=False, decode=decode, minilm=minilm, batch=(2, 8), chain=300
    )
    chain, hits, misses, eager = (result for result, _top in results)
    # the chain of `gpud bench cuda`: two bodies alternating (x -> y, y -> x), both kept
    assert chain.dispatches == 2 * 300 and chain.decoded == 0
    assert hits.dispatches == misses.dispatches >= 2 * decode.layers * transformer.OPS_PER_LAYER
    assert hits.decoded == 0  # every dispatch of a steady step: one lookup, found prepared
    assert 0 < misses.decoded <= misses.dispatches and eager.decoded > 0  # emptied caches; new handles
    assert all(result.ops and result.seconds["intake"] > 0 for result in (chain, hits, misses, eager))
