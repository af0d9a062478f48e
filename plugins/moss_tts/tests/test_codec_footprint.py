"""The MOSS codec's memory beyond its weights: the formula against counted allocations.

Counted on the ``meta`` device (the code paths a GPU takes, no memory used), for the
tiny test codec and one as wide as the release's first decoder transformer.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from wide_codec import wide_codec_config  # noqa: E402

from omni_core.kit.allocation_peak import AllocationPeak  # noqa: E402
from omni_moss_tts.codec import AudioTokenizer, CodecConfig, tiny_codec_config  # noqa: E402


@pytest.mark.parametrize("raw", [tiny_codec_config(), wide_codec_config()], ids=["tiny", "wide"])
def test_the_formula_holds_what_a_full_stream_allocates(raw):
    with torch.device("meta"):
        codec = AudioTokenizer(CodecConfig.from_dict(raw))
    footprint = codec.footprint()
    q = codec.num_quantizers
    for rows, frames in ((1, 4), (1, 48), (4, 48)):
        state = codec.new_stream(rows)
        with torch.inference_mode():  # past every window: the state at its largest
            codec._decode(torch.zeros(q, rows, 400, dtype=torch.long, device="meta"), state)
            codes = torch.zeros(q, rows, frames, dtype=torch.long, device="meta")
            with AllocationPeak() as peak:
                codec._decode(codes, state)
        held = [t for stage in state.kv for pair in stage for t in pair] + [state.position]
        assert footprint.state_bytes * rows == sum(t.untyped_storage().nbytes() for t in held)
        estimated = footprint.chunk_bytes(rows, frames)
        assert peak.bytes <= estimated <= 2 * peak.bytes, (rows, frames, peak.bytes, estimated)
