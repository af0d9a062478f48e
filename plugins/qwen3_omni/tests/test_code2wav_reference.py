"""Code2wav vs transformers 4.57.3's ``Qwen3OmniMoeCode2Wav`` (opt-in: ``-m reference``).

The reference environment (``QWEN_TTS_REF_PYTHON``, see
plugins/qwen3_tts/tests/REFERENCE.md) runs ``reference/code2wav_reference.py``:
a tiny, seeded code2wav with a config unlike our preset (5 codebooks of 40,
width 48, grouped-query attention with biases, a 5-frame window, 3 decoder
blocks: 240 samples per frame, 75 of look-ahead) decodes 37 frames of
random codes for two rows. We load its ``state_dict`` strictly and compare
our full decode and our streams (several chunkings, batched) with its
unchunked forward (relative L2 <= 1e-4), our release-style chunked decode
with its ``chunked_decode``, and our module names and shapes at the release's
geometry with its own.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from reference_support import opt_in, run_reference

torch = pytest.importorskip("torch")
pytest.importorskip("safetensors")

from safetensors.torch import load_file  # noqa: E402

from omni_qwen3_omni.code2wav.config import Code2WavConfig  # noqa: E402
from omni_qwen3_omni.code2wav.model import Code2Wav  # noqa: E402
from omni_qwen3_tts.speech_tokenizer.streaming import StreamState  # noqa: E402

SCRIPT = Path(__file__).parent / "reference" / "code2wav_reference.py"

pytestmark = opt_in

TINY = {
    "codebook_size": 40,
    "hidden_size": 48,
    "num_attention_heads": 6,
    "num_key_value_heads": 2,
    "intermediate_size": 80,
    "num_hidden_layers": 3,
    "sliding_window": 5,
    "num_quantizers": 5,
    "upsample_rates": [5, 4, 3],
    "upsampling_ratios": [2, 2],
    "decoder_dim": 48,
    "attention_bias": True,
    "rope_theta": 5000.0,
    "rms_norm_eps": 1e-6,
    "layer_scale_initial_scale": 0.02,
    "max_position_embeddings": 512,
}
FRAMES, BATCH = 37, 2
CHUNK_SIZE, LEFT_CONTEXT = 12, 4
PREFIXES = [1, 10]
BOUND = 1e-4


def _rel_l2(ours: torch.Tensor, ref: np.ndarray) -> float:
    ref_t = torch.from_numpy(np.asarray(ref)).to(torch.float64)
    return float((ours.to(torch.float64) - ref_t).norm() / ref_t.norm())


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict, dict, dict]:
    out = tmp_path_factory.mktemp("code2wav_ref")
    request = {
        "config": TINY,
        "seed": 3,
        "frames": FRAMES,
        "batch": BATCH,
        "chunk_size": CHUNK_SIZE,
        "left_context": LEFT_CONTEXT,
        "prefixes": PREFIXES,
        "attn_implementation": "sdpa",
    }
    (out / "request.json").write_text(json.dumps(request))
    run_reference(SCRIPT.name, str(out))
    data = np.load(out / "reference.npz")
    release = json.loads((out / "release_keys.json").read_text())
    return {k: data[k] for k in data.files}, load_file(str(out / "code2wav.safetensors")), release


@pytest.fixture(scope="module")
def model(reference) -> Code2Wav:
    torch.set_num_threads(1)
    ours = Code2Wav(Code2WavConfig.from_dict(TINY)).eval()
    result = ours.load_state_dict(reference[1], strict=True)
    assert not result.missing_keys and not result.unexpected_keys
    return ours


@pytest.fixture(scope="module")
def codes(reference) -> torch.Tensor:
    return torch.from_numpy(reference[0]["codes"])


def test_reference_audio_is_a_signal(reference) -> None:
    """Guard the comparison itself: seeded weights make audio that neither clips nor vanishes."""
    full = reference[0]["full"]
    assert full.shape == (BATCH, 1, FRAMES * 240 - 75)
    assert float(full.std()) > 1e-2 and float((np.abs(full) >= 1).mean()) < 0.01


def test_state_dict_keys_and_shapes_are_the_references(reference, model) -> None:
    ours = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    assert ours == {k: tuple(v.shape) for k, v in reference[1].items()}


def test_release_geometry_keys_and_shapes_are_the_references(reference) -> None:
    with torch.device("meta"):
        ours = Code2Wav(Code2WavConfig())
    assert {k: list(v.shape) for k, v in ours.state_dict().items()} == reference[2]


def test_full_decode_matches(reference, model, codes) -> None:
    ref = reference[0]["full"]
    ours = model.decode(codes)
    assert ours.shape == ref.shape == (BATCH, 1, model.output_samples(FRAMES))
    assert _rel_l2(ours, ref) <= BOUND
    for frames in PREFIXES:
        prefix = reference[0][f"prefix/{frames}"]
        short = model.decode(codes[..., :frames])
        assert short.shape == prefix.shape == (BATCH, 1, frames * 240 - 75)
        assert _rel_l2(short, prefix) <= BOUND


@pytest.mark.parametrize("sizes", [[1], [3], [7], [2, 1, 5, 4, 9, 3, 6, 7]])
def test_stream_matches_the_unchunked_forward(reference, model, codes, sizes) -> None:
    ref = reference[0]["full"]
    state = model.new_stream(batch=BATCH)
    pieces, start, turn = [], 0, 0
    while start < FRAMES:
        size = sizes[turn % len(sizes)]
        pieces.append(model.stream(codes[..., start : start + size], state))
        start, turn = start + size, turn + 1
    streamed = torch.cat(pieces, dim=-1)
    assert streamed.shape == ref.shape
    assert _rel_l2(streamed, ref) <= BOUND


def test_stacked_streams_at_different_stages_match(reference, model, codes) -> None:
    """Row 0 runs 9 frames ahead, then both rows advance as one batch."""
    ref = reference[0]["full"]
    first, second = model.new_stream(), model.new_stream()
    heard = [[model.stream(codes[:1, :, :9], first)[0]], []]
    size, starts = 5, [9, 0]
    while max(starts) < FRAMES:
        chunk = [codes[row : row + 1, :, s : s + size] for row, s in enumerate(starts)]
        if min(c.shape[-1] for c in chunk) < size:
            break
        both = StreamState.stack([first, second])
        rows = model.stream_rows(torch.cat(chunk), both)
        for state, part in zip((first, second), both.split([1, 1]), strict=True):
            state.adopt(part)
        for row in range(2):
            heard[row].append(rows[row])
            starts[row] += size
    for row, state in enumerate((first, second)):  # the rest of each row alone
        heard[row].append(model.stream(codes[row : row + 1, :, starts[row] :], state)[0])
    for row in range(2):
        got = torch.cat(heard[row], dim=-1)
        assert got.shape == ref[row].shape
        assert _rel_l2(got, ref[row]) <= BOUND


def test_release_chunked_decode_matches_and_loses_samples(reference, model, codes) -> None:
    """For information: the release's chunked decode, reproduced, is shorter than the forward."""
    ref = reference[0]["chunked"]
    ours = model.chunked_decode(codes, chunk_size=CHUNK_SIZE, left_context=LEFT_CONTEXT)
    assert ours.shape == ref.shape
    chunks = -(-FRAMES // CHUNK_SIZE)
    assert ref.shape[-1] == FRAMES * 240 - chunks * 75
    assert _rel_l2(ours, ref) <= BOUND
