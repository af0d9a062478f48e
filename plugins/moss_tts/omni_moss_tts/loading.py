"""Loading the MOSS-TTS network and its codec: strict by name, or seeded dummy weights.

Both checkpoints load through the kit's strict loader
(``omni_core.kit.weights``): every tensor must land in a parameter of the
same name and shape, and every parameter must be filled, or the error names
what did not match. ``load_format = "dummy"`` fills seeded random weights
from the configs alone (what the ``tiny`` preset and the benchmarks use).
"""

from __future__ import annotations

from pathlib import Path

import torch

from omni_core.kit.source import LOAD_FORMATS
from omni_core.kit.weights import fill_shared, read_json
from omni_qwen3_tts.weights import build_empty, dummy_fill, parse_dtype

from .codec import AudioTokenizer, CodecConfig, dummy_fill_codec
from .config import GenerationDefaults, MossTTSConfig
from .network import MossNetwork
from .source import resolve_codec, resolve_model


def check_load_format(load_format: str) -> None:
    if load_format not in LOAD_FORMATS:
        raise ValueError(f"load_format {load_format!r} is not one of {', '.join(LOAD_FORMATS)}")


def model_root(model_path: str, load_format: str) -> Path:
    resolved = resolve_model(model_path)
    if resolved.preset is not None and load_format != "dummy":
        raise ValueError(
            f"preset {resolved.preset!r} ships configs and tokenizer files only, no weights; "
            "load it with load_format='dummy'"
        )
    return resolved.path


def read_config(root: Path) -> tuple[MossTTSConfig, GenerationDefaults]:
    config = MossTTSConfig.from_dict(read_json(root / "config.json"), f"{root}/config.json")
    defaults = GenerationDefaults.from_dict(
        read_json(root / "generation_config.json", required=False)
    )
    return config, defaults


def load_network(
    root: Path,
    config: MossTTSConfig,
    load_format: str,
    dtype: torch.dtype,
    device: torch.device,
    seed: int,
) -> MossNetwork:
    network = build_empty(lambda: MossNetwork(config), device, dtype)

    def dummy(module: MossNetwork) -> None:
        dummy_fill(module, seed)
        _steer_dummy(module)

    key = f"moss-tts:{root}:{load_format}:{dtype}:{seed}:network"
    return fill_shared(key, network, load_format, root, dummy)


#: The depth the dummy steering was tuned at (the tiny preset's); deeper backbones are damped.
STEERED_DEPTH = 2


def _steer_dummy(network: MossNetwork) -> None:
    """Make random weights speak: enter audio at once, then end each frame with odds 1 in 60.

    Only for ``dummy`` weights (the demo, tests of the serving path,
    benchmarks). Fully random weights make the text head pick a random token
    every step, so the model would write text and never enter audio. Here one
    hidden dimension carries a constant from the text embedding, large enough
    to dominate the final normed state, and the text head reads only that
    dimension for the audio ids: ``audio_start`` and the gen slot score about
    12, the delay slot 6 less (at the release's text temperature of 1.5 the
    segment then ends after about 60 frames, 5 s, when sampled; greedy runs to
    the frame cap), everything else about 0. Audio codes stay random.

    Every decoder layer adds about unit variance to each dimension of the
    residual stream, so at the release's 36 layers the constant's share of
    the final state fell below a fifth and a random text token (the best of
    151936) beat ``audio_start``: the GPU check's MOSS-TTS 8B made no audio.
    The layers' residual writers (``o_proj``, ``down_proj``) are therefore
    damped by ``sqrt(STEERED_DEPTH / layers)``: the stream then holds what
    two undamped layers add, at any depth (the tiny preset's two layers are
    untouched).
    """
    cfg = network.cfg
    hidden = cfg.backbone.hidden_size
    dim = hidden - 1
    share = 0.8  # of the final normed state's norm carried by ``dim``
    damping = min(1.0, (STEERED_DEPTH / cfg.backbone.num_hidden_layers) ** 0.5)
    with torch.no_grad():
        if damping < 1.0:
            for name, weight in network.language_model.layers.named_parameters():
                if name.endswith(("o_proj.weight", "down_proj.weight")):
                    weight.mul_(damping)
        for table in (network.language_model.embed_tokens, *network.emb_ext):
            table.weight.mul_(cfg.channels**-0.5)  # the sum of 33 rows: unit variance
        network.language_model.embed_tokens.weight[:, dim] = (
            share / (1 - share**2) ** 0.5
        ) * hidden**0.5
        for table in network.emb_ext:
            table.weight[:, dim] = 0.0
        head = network.lm_heads[0].weight
        head[:, dim] = 0.0
        unit = 1.0 / (share * hidden**0.5)
        for token, logit in (
            (cfg.audio_start_token_id, 12.0),
            (cfg.audio_assistant_gen_slot_token_id, 12.0),
            (cfg.audio_assistant_delay_slot_token_id, 6.0),
            (cfg.im_end_token_id, 12.0),
        ):
            head[token] = 0.0
            head[token, dim] = logit * unit


# The release computes the codec (MOSS-Audio-Tokenizer) in float32 on every device: its
# processor loads it with no dtype (the codec's config.json says float32) and only moves
# it (``.to(device)``, also on a GPU where the backbone is bf16), and its RLFQ decode sums
# codebook entries into a float32 buffer that meets output_proj's weights, so the release
# with bf16 codec weights fails ("Input type (float) and bias type (BFloat16) should be
# the same"). ``auto`` therefore keeps it float32 whatever the device or the codec's
# config says; an explicit bfloat16 is ours: see :func:`load_codec`.
CODEC_RELEASE_DTYPE = "float32"


def codec_dtype(requested: str | torch.dtype | None, device: torch.device) -> torch.dtype:
    """The vocoder's ``factory.dtype`` resolved: ``auto`` is the release's float32."""
    return parse_dtype(requested, device, config=None, release=CODEC_RELEASE_DTYPE)


def load_codec(
    model_path: str,
    codec_path: str | None,
    load_format: str,
    device: torch.device,
    seed: int,
    dtype: torch.dtype = torch.float32,
) -> AudioTokenizer:
    """The codec, in float32 unless ``dtype`` asks for bf16 (:func:`codec_dtype` decides).

    With bfloat16 only the decoder's transformers compute in it (the part a
    stream runs at every chunk, bound by reading its weights); the quantizer
    keeps float32 weights and sums (the release's float32 state) and the
    encoder stays float32, so a reference clip's codes are the release's.
    """
    check_load_format(load_format)
    if dtype not in (torch.float32, torch.bfloat16):
        raise ValueError(
            f"stage 'vocoder': factory.dtype {dtype} for the MOSS codec: not implemented yet "
            "(float32, the release's, or bfloat16 for its decoder); set auto, float32 or bfloat16"
        )
    root = model_root(model_path, load_format)
    directory = resolve_codec(root, codec_path)
    cfg = CodecConfig.from_dict(read_json(directory / "config.json"))
    codec = build_empty(lambda: AudioTokenizer(cfg), device, torch.float32)
    codec.decoder.to(dtype)
    key = f"moss-tts:{directory}:{load_format}:{seed}:{dtype}:codec"
    return fill_shared(key, codec, load_format, directory, lambda m: dummy_fill_codec(m, seed + 1))


__all__ = [
    "CODEC_RELEASE_DTYPE",
    "check_load_format",
    "codec_dtype",
    "load_codec",
    "load_network",
    "model_root",
    "parse_dtype",
    "read_config",
    "read_json",
]
