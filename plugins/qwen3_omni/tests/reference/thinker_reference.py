"""Reference outputs of the thinker's text decoder and position ids (run by the reference python).

Usage: ``python thinker_reference.py OUT_DIR`` with transformers 4.57.3
(``qwen3_omni_moe``). Writes to OUT_DIR:

- ``config.json``: a thinker section (``text_config`` as the reference
  serialises it, encoder widths equal to the text width, the release's ids);
- ``model.safetensors``: ``model.*`` and ``lm_head.*`` of a tiny, seeded
  Qwen3OmniMoeThinkerTextModel plus an lm_head (the names the thinker has under
  ``thinker.``);
- ``outputs.npz``: one fixed input (random embeddings, three distinct position
  streams, deepstack features at some visual positions, batch of two) and the
  reference's final hidden states, logits and recorded hidden states;
- ``positions.json``: prompts expanded by the reference processor's own
  placeholder rule, and the reference's get_rope_index result for each.
"""

from __future__ import annotations

import json
import re
import sys
import types
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import save_file
from torch import nn
from transformers.utils import import_utils

# Nothing here needs torchvision, and a build of it that does not match the
# machine (a CUDA wheel on a CPU host) fails at import inside transformers'
# image utilities: tell transformers it is absent.
import_utils._torchvision_available = False

from transformers.models.qwen3_omni_moe import modeling_qwen3_omni_moe as ref  # noqa: E402
from transformers.models.qwen3_omni_moe import processing_qwen3_omni_moe as ref_proc  # noqa: E402
from transformers.models.qwen3_omni_moe.configuration_qwen3_omni_moe import (  # noqa: E402
    Qwen3OmniMoeTextConfig,
)

torch.set_num_threads(1)

# The release's special ids (config.json of Qwen3-Omni-30B-A3B-Instruct).
IDS = {
    "<|audio_pad|>": 151675,
    "<|image_pad|>": 151655,
    "<|video_pad|>": 151656,
    "<|vision_start|>": 151652,
    "<|vision_end|>": 151653,
    "<|audio_start|>": 151669,
    "<|audio_end|>": 151670,
}
POSITION_ID_PER_SECONDS = 13
MERGE = 2


def text_config() -> Qwen3OmniMoeTextConfig:
    cfg = Qwen3OmniMoeTextConfig(
        vocab_size=200,
        hidden_size=64,
        intermediate_size=48,
        num_hidden_layers=3,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        rope_theta=10000.0,
        rope_scaling={"rope_type": "default", "mrope_section": [2, 3, 3], "interleaved": True},
        num_experts=8,
        num_experts_per_tok=2,
        moe_intermediate_size=32,
        mlp_only_layers=[1],
        norm_topk_prob=True,
    )
    cfg._attn_implementation = "sdpa"
    return cfg


class Holder(nn.Module):
    """The text half of the reference thinker: ``model`` and ``lm_head`` as it names them."""

    def __init__(self, cfg):
        super().__init__()
        self.model = ref.Qwen3OmniMoeThinkerTextModel(cfg)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)


def build_model(cfg) -> Holder:
    torch.manual_seed(0)
    holder = Holder(cfg).eval()
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for name, p in holder.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(1.0 + 0.1 * torch.randn(p.shape, generator=gen))
            elif name.endswith("mlp.gate.weight"):
                p.copy_(0.5 * torch.randn(p.shape, generator=gen))  # decisive routing
            else:
                p.copy_(0.08 * torch.randn(p.shape, generator=gen))
    return holder


def decoder_outputs(holder: Holder, cfg, out: Path) -> None:
    gen = torch.Generator().manual_seed(2)
    batch, steps, hidden = 2, 12, cfg.hidden_size
    embeds = torch.randn(batch, steps, hidden, generator=gen)
    positions = torch.stack(
        [
            torch.randint(0, 40, (batch, steps), generator=gen),
            torch.randint(0, 40, (batch, steps), generator=gen),
            torch.randint(0, 40, (batch, steps), generator=gen),
        ]
    )
    visual = torch.zeros(batch, steps, dtype=torch.bool)
    visual[0, 3:7] = True
    visual[1, 1:3] = True
    visual[1, 9] = True
    count = int(visual.sum())
    deepstack = [torch.randn(count, hidden, generator=gen) for _ in range(2)]
    with torch.no_grad():
        result = holder.model(
            inputs_embeds=embeds.clone(),
            # An explicit 2D mask, as the thinker always passes one: without it
            # transformers reads non-consecutive positions as packed sequences.
            attention_mask=torch.ones(batch, steps, dtype=torch.long),
            position_ids=positions,
            visual_pos_masks=visual[..., None].expand(-1, -1, hidden),
            deepstack_visual_embeds=[d.clone() for d in deepstack],
            use_cache=False,
            output_hidden_states=True,
        )
        logits = holder.lm_head(result.last_hidden_state)
    arrays = {
        "inputs_embeds": embeds,
        "positions": positions,
        "visual": visual,
        "hidden": result.last_hidden_state,
        "logits": logits,
    }
    for i, d in enumerate(deepstack):
        arrays[f"deepstack_{i}"] = d
    for i, h in enumerate(result.hidden_states):
        arrays[f"hidden_states_{i}"] = h
    np.savez(out / "outputs.npz", **{k: v.numpy() for k, v in arrays.items()})


# Each prompt: segments ("text", n) | ("image", grid) | ("audio", mel_frames) |
# ("video", grid, seconds_per_grid) | ("video_audio", grid, seconds_per_grid, mel_frames).
PROMPTS = {
    "text": [("text", 7)],
    "image": [("text", 3), ("image", [1, 4, 6]), ("text", 4)],
    "audio": [("text", 2), ("audio", 250), ("text", 3)],
    "image_audio": [("text", 2), ("image", [1, 4, 4]), ("text", 1), ("audio", 100), ("text", 3)],
    "two_images": [
        ("text", 2),
        ("image", [1, 4, 6]),
        ("text", 2),
        ("image", [1, 6, 4]),
        ("text", 2),
    ],
    "video": [("text", 2), ("video", [3, 4, 4], 2.0), ("text", 3)],
    "image_video_audio": [
        ("audio", 130),
        ("image", [1, 4, 4]),
        ("video", [2, 4, 6], 1.0),
        ("text", 2),
    ],
    "video_with_audio": [("text", 2), ("video_audio", [3, 4, 4], 1.0, 400), ("text", 3)],
    # A short clip in a big frame: the interleaving ends with audio tokens whose
    # largest position is below the frame's largest width position.
    "video_with_short_audio": [("text", 1), ("video_audio", [1, 12, 12], 2.0, 30), ("text", 2)],
    "audio_then_video_with_audio": [
        ("audio", 120),
        ("text", 1),
        ("video_audio", [2, 4, 4], 2.0, 180),
        ("text", 1),
    ],
}


def position_case(name: str, segments: list) -> dict:
    text, text_id = "", 10
    grids_img, grids_vid, seconds, mels = [], [], [], []
    in_video = False
    for seg in segments:
        kind = seg[0]
        if kind == "text":
            for _ in range(seg[1]):
                text += f"<t:{text_id}>"
                text_id += 1
        elif kind == "image":
            grids_img.append(seg[1])
            text += "<|vision_start|><|image_pad|><|vision_end|>"
        elif kind == "audio":
            mels.append(seg[1])
            text += "<|audio_start|><|audio_pad|><|audio_end|>"
        elif kind in ("video", "video_audio"):
            grids_vid.append(seg[1])
            seconds.append(seg[2])
            if kind == "video_audio":
                mels.append(seg[3])
                in_video = True
            text += "<|vision_start|><|video_pad|><|vision_end|>"
    fake_proc = types.SimpleNamespace(
        image_processor=types.SimpleNamespace(merge_size=MERGE),
        video_processor=types.SimpleNamespace(merge_size=MERGE),
        audio_token="<|audio_pad|>",
        image_token="<|image_pad|>",
        video_token="<|video_pad|>",
        vision_bos_token="<|vision_start|>",
        vision_eos_token="<|vision_end|>",
        audio_bos_token="<|audio_start|>",
        audio_eos_token="<|audio_end|>",
    )
    mel_t = torch.tensor(mels, dtype=torch.long)
    (expanded,) = ref_proc.Qwen3OmniMoeProcessor.replace_multimodal_special_tokens(
        fake_proc,
        [text],
        iter(ref_proc._get_feat_extract_output_lengths(mel_t).tolist()),
        iter(torch.tensor(grids_img, dtype=torch.long).reshape(-1, 3)),
        iter(torch.tensor(grids_vid, dtype=torch.long).reshape(-1, 3)),
        video_second_per_grid=iter(seconds),
        use_audio_in_video=in_video,
        position_id_per_seconds=POSITION_ID_PER_SECONDS,
        seconds_per_chunk=2.0,
    )
    ids = [
        IDS[tok] if tok in IDS else int(tok[3:-1])
        for tok in re.findall(r"<\|[a-z_]+\|>|<t:\d+>", expanded)
    ]
    fake_model = types.SimpleNamespace(
        spatial_merge_size=MERGE,
        config=types.SimpleNamespace(
            image_token_id=IDS["<|image_pad|>"],
            video_token_id=IDS["<|video_pad|>"],
            audio_token_id=IDS["<|audio_pad|>"],
            vision_start_token_id=IDS["<|vision_start|>"],
            audio_start_token_id=IDS["<|audio_start|>"],
            position_id_per_seconds=POSITION_ID_PER_SECONDS,
        ),
    )
    cls = ref.Qwen3OmniMoePreTrainedModelForConditionalGeneration
    fake_model.get_llm_pos_ids_for_vision = types.MethodType(
        cls.get_llm_pos_ids_for_vision, fake_model
    )
    input_ids = torch.tensor([ids], dtype=torch.long)
    positions, delta = cls.get_rope_index(
        fake_model,
        input_ids,
        torch.tensor(grids_img, dtype=torch.long).reshape(-1, 3) if grids_img else None,
        torch.tensor(grids_vid, dtype=torch.long).reshape(-1, 3) if grids_vid else None,
        torch.ones_like(input_ids),
        in_video,
        mel_t if mels else None,
        torch.tensor(seconds) if seconds else None,
    )
    flat = positions[:, 0].float()
    assert torch.equal(flat, flat.round()), name
    return {
        "name": name,
        "ids": ids,
        "image_grids": grids_img,
        "video_grids": grids_vid,
        "video_seconds_per_grid": seconds,
        "mel_frames": mels,
        "audio_tokens": ref_proc._get_feat_extract_output_lengths(mel_t).tolist(),
        "positions": flat.long().tolist(),
        "rope_delta": float(delta.reshape(-1)[0]),
    }


def main() -> None:
    out = Path(sys.argv[1])
    out.mkdir(parents=True, exist_ok=True)
    cfg = text_config()
    holder = build_model(cfg)
    state = {k: v.detach().contiguous().clone() for k, v in holder.state_dict().items()}
    save_file(state, str(out / "model.safetensors"))
    thinker = {
        "text_config": cfg.to_dict(),
        "audio_config": {"output_dim": cfg.hidden_size},
        "vision_config": {"out_hidden_size": cfg.hidden_size, "spatial_merge_size": MERGE},
        "audio_token_id": IDS["<|audio_pad|>"],
        "image_token_id": IDS["<|image_pad|>"],
        "video_token_id": IDS["<|video_pad|>"],
        "audio_start_token_id": IDS["<|audio_start|>"],
        "vision_start_token_id": IDS["<|vision_start|>"],
        "position_id_per_seconds": POSITION_ID_PER_SECONDS,
    }
    (out / "config.json").write_text(json.dumps({"thinker_config": thinker}, indent=1))
    decoder_outputs(holder, cfg, out)
    cases = [position_case(name, segs) for name, segs in PROMPTS.items()]
    (out / "positions.json").write_text(json.dumps(cases))


if __name__ == "__main__":
    main()
