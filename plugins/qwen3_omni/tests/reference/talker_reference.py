"""Record what the reference talker makes of a thinker's outputs (transformers 4.57.3).

Runs inside the reference environment, never inside omni's. Usage::

    python talker_reference.py OUT_DIR

Builds a tiny ``Qwen3OmniMoeForConditionalGeneration`` whose talker differs
from our ``tiny`` preset in every dimension that could hide a mistake
(talker width 48 with 3 layers, 6 experts top-3 without top-k renormalisation,
a shared expert of its own width, head_dim 12 with M-RoPE section [2, 2, 2],
a code predictor of 2 layers over 8 code groups, ``accept_hidden_layer`` 1:
the thinker's layer-0 output, which a deepstack addition modifies), gives every tensor seeded O(1)
values and runs the library's own ``generate(..., return_audio=True,
speaker=...)`` greedily on hand-built prompts. The prompts are token ids
written out directly (no tokenizer, processor or torchvision needed): the
talker only reads the role and media ids, which are the release's.

The release's talker samples its code predictor whatever ``talker_do_sample``
says; the predictor's ``generate`` is wrapped here to run greedily, so that
the run is deterministic. ``code2wav`` is skipped (its input, the codes, is
what we record).

Writes to ``OUT_DIR``:

- ``config.json``: the whole model's config (``talker_config`` inside);
- ``model.safetensors``: the talker's tensors under their release names
  (``talker.*``), as the talker stage finds them in a checkpoint;
- ``manifest.json``: per case its name, speaker, token limits, how many
  frames came out and the smallest greedy margins;
- ``CASE.safetensors`` per case:

  ``prompt_ids [T]``, ``generated_ids [N]`` (the thinker's greedy output),
  ``thinker_positions [3, T]`` (its M-RoPE positions of the prompt),
  ``thinker_embeds [T + N - 1, Ht]`` / ``thinker_accept [T + N - 1, Ht]``
  (``hidden_states[0]`` and ``hidden_states[accept_hidden_layer]`` of the
  prompt and of every generated token the thinker fed back: all but the
  last), ``tts_embeds [3, Ht]`` (the thinker's embeddings of tts_bos,
  tts_eos, tts_pad), ``talker_prefill [L, H]`` and ``talker_trailing [n, H]``
  (the inputs the reference built), ``talker_positions [3, L + steps]`` (the
  positions of every talker forward, concatenated), ``codes [F, G]`` (the
  frames), ``code0 [F + 1]`` (every codebook-0 token the talker sampled, the
  last one has no frame), ``code0_margins [F + 1]`` and
  ``predictor_margins [F, G - 1]`` (top-1 minus top-2 of the processed scores
  at each greedy pick).
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

# Nothing here needs torchvision; a build of it that does not match this torch
# (a CUDA wheel on a CPU host) breaks transformers' imports, so hide it.
sys.modules.setdefault("torchvision", None)

import torch  # noqa: E402
from safetensors.torch import save_file  # noqa: E402
from transformers.models.qwen3_omni_moe.configuration_qwen3_omni_moe import (  # noqa: E402
    Qwen3OmniMoeConfig,
)
from transformers.models.qwen3_omni_moe.modeling_qwen3_omni_moe import (  # noqa: E402
    Qwen3OmniMoeForConditionalGeneration,
    _get_feat_extract_output_lengths,
)

torch.set_num_threads(1)

SEED = 5
IM_START, IM_END, NEWLINE = 151644, 151645, 198
SYSTEM, USER, ASSISTANT = 8948, 872, 77091
VISION_START, IMAGE, VISION_END = 151652, 151655, 151653
AUDIO_START, AUDIO, AUDIO_END = 151669, 151675, 151670
CODEBOOK, GROUPS = 64, 8
THINKER_HIDDEN = 48
MEDIA = {
    "audio_token_id": AUDIO,
    "image_token_id": IMAGE,
    "video_token_id": 151656,
    "audio_start_token_id": AUDIO_START,
    "audio_end_token_id": AUDIO_END,
    "vision_start_token_id": VISION_START,
    "vision_end_token_id": VISION_END,
    "position_id_per_seconds": 13,
    "seconds_per_chunk": 2,
}
IMAGE_GRID = (1, 4, 6)  # patches: 24, i.e. 6 image tokens after the 2x2 merge
AUDIO_FRAMES = 130  # mel frames of the clip

# name, prompt kind, prompt seed, speaker, thinker tokens, talker tokens (frames =
# talker tokens - 1, unless the talker ends with its EOS first, as in text_eos).
CASES = [
    ("text", "text", 11, "Ethan", 12, 30),
    ("image_audio", "image_audio", 12, "chelsie", 9, 28),
    ("short", "short", 13, "Aiden", 3, 26),
    ("text_eos", "text", 7, "Ethan", 12, 30),
]


def config() -> Qwen3OmniMoeConfig:
    rope = {"rope_type": "default", "mrope_section": [3, 3, 2], "interleaved": True}
    thinker = {
        **MEDIA,
        "user_token_id": USER,
        "audio_config": {
            "num_mel_bins": 128,
            "d_model": 48,
            "encoder_layers": 2,
            "encoder_attention_heads": 3,
            "encoder_ffn_dim": 96,
            "downsample_hidden_size": 8,
            "output_dim": THINKER_HIDDEN,
            "n_window": 50,
            "n_window_infer": 800,
        },
        "vision_config": {
            "depth": 2,
            "hidden_size": 48,
            "num_heads": 3,
            "intermediate_size": 96,
            "patch_size": 16,
            "spatial_merge_size": 2,
            "temporal_patch_size": 2,
            "out_hidden_size": THINKER_HIDDEN,
            "num_position_embeddings": 576,
            "deepstack_visual_indexes": [0, 1],
        },
        "text_config": {
            "vocab_size": 152064,
            "hidden_size": THINKER_HIDDEN,
            "intermediate_size": 96,
            "num_hidden_layers": 3,
            "num_attention_heads": 4,
            "num_key_value_heads": 2,
            "head_dim": 16,
            "rope_theta": 1_000_000.0,
            "rope_scaling": rope,
            "moe_intermediate_size": 24,
            "num_experts": 6,
            "num_experts_per_tok": 3,
            "norm_topk_prob": True,
        },
    }
    talker = {
        **MEDIA,
        "thinker_hidden_size": THINKER_HIDDEN,
        "accept_hidden_layer": 1,
        "num_code_groups": GROUPS,
        "spatial_merge_size": 2,
        "codec_pad_id": CODEBOOK + 100,
        "codec_bos_id": CODEBOOK + 101,
        "codec_eos_token_id": CODEBOOK + 102,
        "codec_nothink_id": CODEBOOK + 107,
        "codec_think_bos_id": CODEBOOK + 108,
        "codec_think_eos_id": CODEBOOK + 109,
        "speaker_id": {"chelsie": CODEBOOK + 253, "ethan": CODEBOOK + 254, "aiden": CODEBOOK + 255},
        "text_config": {
            "vocab_size": CODEBOOK + 1024,
            "hidden_size": 48,
            "intermediate_size": 40,
            "num_hidden_layers": 3,
            "num_attention_heads": 6,
            "num_key_value_heads": 2,
            "head_dim": 12,
            "rope_theta": 1_000_000.0,
            "rope_scaling": {
                "rope_type": "default",
                "mrope_section": [2, 2, 2],
                "interleaved": True,
            },
            "moe_intermediate_size": 24,
            "shared_expert_intermediate_size": 36,
            "num_experts": 6,
            "num_experts_per_tok": 3,
            "norm_topk_prob": False,
        },
        "code_predictor_config": {
            "vocab_size": CODEBOOK,
            "hidden_size": 48,
            "intermediate_size": 56,
            "num_hidden_layers": 2,
            "num_attention_heads": 4,
            "num_key_value_heads": 2,
            "head_dim": 12,
            "rope_theta": 10000.0,
            "num_code_groups": GROUPS,
        },
    }
    code2wav = {
        "codebook_size": CODEBOOK,
        "hidden_size": 32,
        "intermediate_size": 64,
        "num_hidden_layers": 1,
        "num_attention_heads": 4,
        "num_key_value_heads": 4,
        "num_quantizers": GROUPS,
        "decoder_dim": 32,
    }
    return Qwen3OmniMoeConfig(
        thinker_config=thinker, talker_config=talker, code2wav_config=code2wav
    )


def randomise(module: torch.nn.Module, seed: int) -> None:
    """Seeded values with O(1) activations (the library's own init is near-trivial)."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, tensor in sorted(module.state_dict().items()):
            if not tensor.is_floating_point():
                continue
            noise = torch.randn(tensor.shape, generator=gen)
            if tensor.dim() <= 1:
                value = 0.1 * noise + (1.0 if name.endswith(".weight") else 0.0)
            elif "embed" in name:
                value = noise
            else:
                value = noise / math.sqrt(max(tensor[0].numel(), 1))
            tensor.copy_(value)


def words(gen: torch.Generator, count: int) -> list[int]:
    return torch.randint(1000, 20000, (count,), generator=gen).tolist()


def turn(role: int, body: list[int]) -> list[int]:
    return [IM_START, role, NEWLINE, *body, IM_END, NEWLINE]


def prompt(name: str, gen: torch.Generator) -> tuple[list[int], dict]:
    """Prompt ids and the media inputs ``generate`` takes with them."""
    extra: dict = {}
    if name == "image_audio":
        t, h, w = IMAGE_GRID
        audio_tokens = int(_get_feat_extract_output_lengths(torch.tensor(AUDIO_FRAMES)))
        body = [VISION_START, *[IMAGE] * (t * h * w // 4), VISION_END]
        body += [AUDIO_START, *[AUDIO] * audio_tokens, AUDIO_END, *words(gen, 4)]
        ids = turn(SYSTEM, words(gen, 5)) + turn(USER, body)
        extra = {
            "pixel_values": torch.randn(t * h * w, 3 * 2 * 16 * 16, generator=gen),
            "image_grid_thw": torch.tensor([IMAGE_GRID]),
            "input_features": torch.randn(1, 128, AUDIO_FRAMES, generator=gen),
            "feature_attention_mask": torch.ones(1, AUDIO_FRAMES, dtype=torch.long),
        }
    elif name == "text":
        # Two user turns around an earlier answer: the talker keeps both user
        # turns and drops the system turn and the earlier answer.
        ids = (
            turn(SYSTEM, words(gen, 6))
            + turn(USER, words(gen, 7))
            + turn(ASSISTANT, words(gen, 5))
            + turn(USER, words(gen, 4))
        )
    else:
        ids = turn(USER, words(gen, 3))
    return [*ids, IM_START, ASSISTANT, NEWLINE], extra


def margins(scores) -> torch.Tensor:
    top = torch.stack([s[0].float().topk(2).values for s in scores])
    return top[:, 0] - top[:, 1]


def main() -> None:
    out = Path(sys.argv[1])
    out.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(SEED)
    cfg = config()
    model = Qwen3OmniMoeForConditionalGeneration(cfg).eval()
    randomise(model, SEED + 1)
    (out / "config.json").write_text(cfg.to_json_string())
    talker_state = {f"talker.{k}": v.contiguous() for k, v in model.talker.state_dict().items()}
    save_file(talker_state, str(out / "model.safetensors"))

    record: dict = {}
    predictor = model.talker.code_predictor
    predictor_generate = predictor.generate

    def greedy_predictor(*args, **kwargs):
        kwargs.update(do_sample=False, top_k=None, top_p=None, output_scores=True)
        kwargs["return_dict_in_generate"] = True
        result = predictor_generate(*args, **kwargs)
        record["predictor_margins"].append(margins(result.scores))
        return result

    predictor.generate = greedy_predictor

    talker_generate = model.talker.generate

    def talker_recorded(*args, **kwargs):
        record["talker_prefill"] = kwargs["inputs_embeds"][0].clone()
        record["talker_trailing"] = kwargs["trailing_text_hidden"][0].clone()
        kwargs["output_scores"] = True
        result = talker_generate(*args, **kwargs)
        record["code0"] = result.sequences[0].clone()
        record["code0_margins"] = margins(result.scores)
        return result

    model.talker.generate = talker_recorded

    def positions_hook(_module, _args, kwargs):
        record["talker_positions"].append(kwargs["position_ids"][:, 0].clone())

    model.talker.model.register_forward_pre_hook(positions_hook, with_kwargs=True)

    def skip_code2wav(codes, **_kwargs):
        record["codes"] = codes[0].t().clone()  # [G, F] -> [F, G]
        return torch.zeros(1, 1, 1)

    model.code2wav.chunked_decode = skip_code2wav

    manifest = []
    accept = cfg.talker_config.accept_hidden_layer
    for name, kind, prompt_seed, speaker, thinker_tokens, talker_tokens in CASES:
        ids, extra = prompt(kind, torch.Generator().manual_seed(prompt_seed))
        input_ids = torch.tensor([ids])
        attention_mask = torch.ones_like(input_ids)
        record.clear()
        record.update(predictor_margins=[], talker_positions=[])
        model.thinker.rope_deltas = None
        model.talker.rope_deltas = None
        with torch.no_grad():
            audio_lengths = extra["feature_attention_mask"].sum(-1) if extra else None
            positions, _ = model.thinker.get_rope_index(
                input_ids,
                extra.get("image_grid_thw"),
                None,
                attention_mask,
                False,
                audio_lengths,
                None,
            )
            thinker_result, _ = model.generate(
                input_ids=input_ids,
                attention_mask=attention_mask,
                speaker=speaker,
                return_audio=True,
                thinker_max_new_tokens=thinker_tokens,
                thinker_do_sample=False,
                talker_do_sample=False,
                talker_max_new_tokens=talker_tokens,
                **extra,
            )
            steps = thinker_result.hidden_states
            embeds = torch.cat([h[0] for h in steps], dim=1)[0]
            accepted = torch.cat([h[accept] for h in steps], dim=1)[0]
            special = torch.tensor(
                [[cfg.tts_bos_token_id, cfg.tts_eos_token_id, cfg.tts_pad_token_id]]
            )
            tts = model.thinker.get_input_embeddings()(special)[0]
        generated = thinker_result.sequences[0, len(ids) :]
        tensors = {
            "prompt_ids": input_ids[0],
            "generated_ids": generated,
            "thinker_positions": positions[:, 0].long(),
            "thinker_embeds": embeds,
            "thinker_accept": accepted,
            "tts_embeds": tts,
            "talker_prefill": record["talker_prefill"],
            "talker_trailing": record["talker_trailing"],
            "talker_positions": torch.cat(record["talker_positions"], dim=1).long(),
            "codes": record["codes"].long(),
            "code0": record["code0"].long(),
            "code0_margins": record["code0_margins"],
            "predictor_margins": torch.stack(record["predictor_margins"]),
        }
        save_file({k: v.contiguous() for k, v in tensors.items()}, str(out / f"{name}.safetensors"))
        manifest.append(
            {
                "name": name,
                "speaker": speaker,
                "thinker_max_new_tokens": thinker_tokens,
                "talker_max_new_tokens": talker_tokens,
                "generated": len(generated),
                "frames": int(record["codes"].shape[0]),
                "min_code0_margin": float(record["code0_margins"].min()),
                "min_predictor_margin": float(tensors["predictor_margins"].min()),
                "distinct_code0": len(set(record["code0"].tolist())),
            }
        )
    (out / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n")


if __name__ == "__main__":
    main()
