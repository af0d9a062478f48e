"""The codecs' streamed chunks captured as CUDA graphs hear what eager chunks hear.

Marked ``cuda`` (run by ``benchmarks/gpu_check.py``). On the CPU the same
code runs with a stand-in for the graphs (``plugins/qwen3_tts/tests/
test_stream_graphs.py``); here the graphs are real: the capture must
succeed (no chunk reads the device), each graph passes its own check
against an eager chunk, and streams batched in changing company through
them equal the full decode of their codes. Qwen3-TTS's decoder and
Qwen3-Omni's code2wav, whose first chunk of a stream cuts a lead; and
MOSS-TTS's codec, whose captured chunks carry full windows in one shared
state tensor (``omni_moss_tts/codec/graphs.py``).
"""

from __future__ import annotations

import os

import pytest

torch = pytest.importorskip("torch")

pytestmark = pytest.mark.cuda

DEVICE = os.environ.get("OMNI_CUDA_DEVICE", "cuda")


def _decoder(family: str):
    from omni_qwen3_tts.weights import dummy_fill

    if family == "qwen3-tts":
        from omni_qwen3_tts.model import Qwen3TTSModel

        return Qwen3TTSModel.from_pretrained(
            "tiny", load_format="dummy", seed=0
        ).speech_tokenizer.decoder
    import json

    from omni_qwen3_omni.code2wav.config import Code2WavConfig
    from omni_qwen3_omni.code2wav.model import Code2Wav
    from omni_qwen3_omni.source import PRESETS_DIR

    preset = json.loads((PRESETS_DIR / "tiny" / "config.json").read_text())
    model = Code2Wav(Code2WavConfig.from_dict(preset)).eval()
    dummy_fill(model, 1)
    return model


@pytest.mark.parametrize("family", ["qwen3-tts", "code2wav"])
def test_captured_chunks_equal_eager_chunks_and_the_full_decode(family: str) -> None:
    from omni_qwen3_tts.stages import Vocoder

    cpu = _decoder(family)
    gpu = _decoder(family).to(DEVICE)
    vocoder = Vocoder(gpu, 2, None, max_batch_size=4, max_chunk_frames=4)
    assert vocoder.graphs is not None, vocoder.graph_note
    assert sorted(vocoder.graphs.graphs) == [(b, t) for b in (1, 2, 4) for t in (2, 4)]
    eager = Vocoder(gpu, 2, None, max_batch_size=4, max_chunk_frames=4, cuda_graph=False)
    assert eager.graphs is None
    gen = torch.Generator().manual_seed(5)
    shape = (1, cpu.cfg.num_quantizers, 10)
    codes = [torch.randint(0, cpu.cfg.codebook_size, shape, generator=gen) for _ in range(3)]
    heard: dict[str, list[list[torch.Tensor]]] = {}
    for name, way in (("graph", vocoder), ("eager", eager)):
        streams = [gpu.new_stream() for _ in codes]
        heard[name] = [[], [], []]
        played = [0, 0, 0]
        for rows, length in (([0, 1], 2), ([0, 1, 2], 4), ([2], 2), ([1, 0, 2], 4)):
            batch = torch.cat([codes[r][..., played[r] : played[r] + length] for r in rows])
            audio = way.decode_streams(batch, [streams[r] for r in rows])
            for r, row in zip(rows, audio, strict=True):
                heard[name][r].append(torch.as_tensor(row))  # [samples], on the host
                played[r] += length
    assert vocoder.graphs.replays == 4
    for r in range(3):
        graph, plain = torch.cat(heard["graph"][r]), torch.cat(heard["eager"][r])
        assert graph.shape == plain.shape
        assert float((graph - plain).abs().max()) < 1e-4  # the same kernels, replayed
        full = cpu(codes[r])[0, 0]  # every stream played its 10 frames
        assert graph.shape == full.shape
        # the GPU's convolutions may round as TF32: the full decode on the CPU, loosely
        relative = float((graph - full.float()).norm() / full.float().norm())
        assert relative < 1e-2, relative


def test_moss_codec_captured_chunks_equal_eager_chunks_and_the_full_decode() -> None:
    from omni_moss_tts.codec import AudioTokenizer, CodecConfig, dummy_fill_codec, tiny_codec_config
    from omni_qwen3_tts.stages import Vocoder

    def codec() -> AudioTokenizer:
        tok = AudioTokenizer(CodecConfig.from_dict(tiny_codec_config(0.4))).eval()
        dummy_fill_codec(tok, 0)
        return tok

    cpu, gpu = codec(), codec().to(DEVICE)

    def vocoder(**kwargs):
        return Vocoder(gpu, 2, None, 4, 8, 24000, chunk_growth=4, chunk_memory=None, **kwargs)

    captured, eager = vocoder(), vocoder(cuda_graph=False)
    assert captured.graphs is not None, captured.graph_note
    assert sorted(captured.graphs.graphs) == [(b, t) for b in (1, 2, 4) for t in (2, 8)]
    gen = torch.Generator().manual_seed(6)
    codes = [torch.randint(0, 1024, (1, 32, 40), generator=gen) for _ in range(3)]
    heard: dict[str, list[list[torch.Tensor]]] = {}
    for name, way in (("graph", captured), ("eager", eager)):
        streams = [gpu.new_stream() for _ in codes]
        heard[name] = [[], [], []]
        played = [0, 0, 0]
        for rows, length in (([0, 1], 2), ([0, 1, 2], 8), ([2], 2), ([1, 0, 2], 8),
                             ([0, 2], 8), ([1], 3), ([2, 1, 0], 8)):  # fmt: skip
            batch = torch.cat([codes[r][..., played[r] : played[r] + length] for r in rows])
            audio = way.decode_streams(batch.to(DEVICE), [streams[r] for r in rows])
            for r, row in zip(rows, audio, strict=True):
                heard[name][r].append(torch.as_tensor(row).reshape(-1))
                played[r] += length
    assert captured.graphs.replays == 6  # the 3-frame chunk ran eagerly
    for r in range(3):
        graph, plain = torch.cat(heard["graph"][r]), torch.cat(heard["eager"][r])
        assert graph.shape == plain.shape
        assert float((graph - plain).abs().max()) < 1e-4
        full = cpu.decode(codes[r][0].t())[: graph.numel()]
        relative = float((graph - full).norm() / full.norm())  # TF32 products on the GPU
        assert relative < 1e-2, relative
