"""The TMA kernels' launch layout: which entry points take tensor maps, and where each parameter lies in
a launch's bytes (two 128-byte maps, then 8-byte slots). Pure Python, no GPU."""

from __future__ import annotations

from gpud.backends.cuda import tma
from gpud_protocol.ops.matmul_tma import TMA_TILES


def test_every_tma_entry_point_has_its_layout_and_no_other_kernel_has_one() -> None:
    for name, tile in TMA_TILES.items():
        layout = tma.layout(name)
        assert layout is not None and (layout.box_x, layout.box_w) == (tile.bm, tile.bn)
        assert layout.data_type == (9 if "_bf16_" in name else 6)
    for name in ("matmul_wg128x64_f16_f16", "matmul_f16_f16", "scale", ""):
        assert tma.layout(name) is None


def test_the_parameters_follow_the_two_maps() -> None:
    assert tma.TmaLayout(6, 128, 128).offsets(12) == [0, 128, *range(256, 256 + 8 * 10, 8)]
