"""``bench_moss_tts``'s projection to the release's 36 layers: each side's backbone time
grows with depth, the heads, sampling and codec do not."""

from __future__ import annotations

from collections.abc import Iterator
from types import ModuleType

import pytest


@pytest.fixture(scope="module")
def moss_bench(load_script) -> Iterator[ModuleType]:
    with load_script("bench_moss_tts.py") as module:
        yield module


def _level(
    bench: ModuleType, concurrency: int, wall_s: float, backbone_s: float, alone_s: float
) -> object:
    return bench.Level(
        concurrency=concurrency,
        wall_s=wall_s,
        audio_s=4.0 * concurrency,
        first_audio_s=[1.0],
        frames=[50] * concurrency,
        steps=82,
        codec_chunks=4,
        codec_batches=4,
        parts={"backbone_s": backbone_s, "backbone_alone_s": alone_s},
    )


def test_only_the_backbone_grows_to_the_release_depth(moss_bench, capsys):
    # 2 layers: ours 13 s of which 3 s backbone, 2.5 s at the pace of its steps that no
    # codec call slowed (what scales: deeper, the codec overlaps few steps); the
    # reference 34 s of which 8.5 s (it decodes after generating)
    ours = _level(moss_bench, 8, wall_s=13.0, backbone_s=3.0, alone_s=2.5)
    ref = {8: {"wall_s": 34.0, "backbone_s": 8.5, "audio_s": 32.0}}
    (row,) = moss_bench.projected_rows([ours], ref, layers=2)
    assert row["ours_wall_s"] == pytest.approx(13.0 + 2.5 * 17)
    assert row["reference_wall_s"] == pytest.approx(34.0 + 8.5 * 17)
    assert row["speed_ratio"] == pytest.approx((34.0 + 8.5 * 17) / (13.0 + 2.5 * 17))
    # deeper, the ratio leaves the measured 2.6x for the backbones' 3.4x
    assert 34.0 / 13.0 < row["speed_ratio"] < 8.5 / 2.5
    out = capsys.readouterr().out
    assert "projected to the release's 36 layers" in out and f"{row['speed_ratio']:.2f}x" in out


def test_nothing_is_projected_at_the_release_depth_or_without_the_reference(moss_bench, capsys):
    ours = _level(moss_bench, 1, wall_s=4.0, backbone_s=2.0, alone_s=2.0)
    ref = {1: {"wall_s": 12.0, "backbone_s": 4.0, "audio_s": 4.0}}
    assert moss_bench.projected_rows([ours], ref, layers=36) == []
    assert moss_bench.projected_rows([ours], {}, layers=2) == []
    assert capsys.readouterr().out == ""
