"""The reference in bfloat16 on the checkpoint ``make_reference.py`` just saved (reference python).

Called by ``make_reference.py`` when its request has ``"bf16": true``. The
checkpoint is loaded the way a user loads the release in bf16,
``from_pretrained(ckpt, dtype=torch.bfloat16)``, and every case's inputs are
cast as the release's model card does (``inputs.to(model.dtype)``: the
floating features, not the ids). Per case it records, under ``ref/bf16/``:

``CASE.safetensors`` (float32 / int64):
    input_ids [T]                  the processor's ids (same as in float32)
    generated_ids [G]              greedy continuation of the bf16 model
    generated_margins [G]          top-1 minus top-2 of its scores at each step
    decode_drift [G]               max |score - tf_logits_bf16| per step: how far the
                                   reference's cached decode steps land from its own
                                   full forward (bf16 rounding of other shapes)
    tf_logits_bf16 [G, V]          teacher-forced logits: one bf16 forward of the
                                   prompt plus ``generated_ids[:-1]``, rows ``T-1..``
    tf_logits_fp32 [G, V]          the same forward by the float32 model (the
                                   yardstick: how far bf16 moves the reference itself)
    hidden_bf16 [L+1, T, H]        the bf16 prompt forward's hidden states
    with images: image_embeds, deepstack_K (bf16 tower outputs, as float32)
    with audio:  audio_embeds

and in the manifest, ``bf16``: the loaded model's parameter dtype, the dtype
of every floating buffer (rotary tables, sinusoids: what ``from_pretrained``
left in float32), and per case ``generated_ids``, ``stopped_on_eos`` and
``min_margin``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file

EOS = 151645


def _buffer_dtypes(model: torch.nn.Module) -> dict[str, str]:
    """Each distinct floating buffer name (layer indexes dropped) and its dtype."""
    seen: dict[str, str] = {}
    for name, buf in model.named_buffers():
        if buf.is_floating_point():
            key = ".".join(p for p in name.split(".") if not p.isdigit())
            seen.setdefault(key, str(buf.dtype).removeprefix("torch."))
    return seen


def _teacher_forced(thinker: Any, inputs: dict, generated: torch.Tensor) -> torch.Tensor:
    """Logits ``[G, V]`` predicting each generated token from one full forward."""
    ids = inputs["input_ids"]
    prompt_len, steps = ids.shape[1], generated.shape[0]
    full = torch.cat([ids, generated[None, : steps - 1]], dim=1)
    args = dict(inputs)
    args["input_ids"] = full
    args["attention_mask"] = torch.ones_like(full)
    thinker.rope_deltas = None
    logits = thinker(**args, use_cache=False).logits[0]
    return logits[prompt_len - 1 : prompt_len - 1 + steps].float()


def record_bf16(
    ckpt: Path,
    ref: Path,
    fp32_model: Any,
    attn: str,
    max_new: int,
    case_inputs: list[tuple[str, Any]],
) -> dict:
    """Run every case in bf16; write ``ref/bf16/CASE.safetensors``; return the manifest entry.

    ``case_inputs``: (name, the processor's float32 ``BatchFeature``) per case.
    """
    from transformers import Qwen3OmniMoeForConditionalGeneration

    model = Qwen3OmniMoeForConditionalGeneration.from_pretrained(
        ckpt, dtype=torch.bfloat16, attn_implementation=attn
    ).eval()
    out = ref / "bf16"
    out.mkdir(parents=True, exist_ok=True)
    thinker, thinker32 = model.thinker, fp32_model.thinker
    cases = {}
    for name, inputs32 in case_inputs:
        # As the release's model card does (BatchFeature.to casts in place: a copy first).
        inputs = type(inputs32)(dict(inputs32)).to(model.dtype)
        assert torch.equal(inputs["input_ids"], inputs32["input_ids"])
        record: dict[str, torch.Tensor] = {"input_ids": inputs["input_ids"][0]}
        with torch.no_grad():
            if "pixel_values" in inputs:
                embeds, deepstack = thinker.get_image_features(
                    inputs["pixel_values"], inputs["image_grid_thw"]
                )
                record["image_embeds"] = embeds
                for k, extra in enumerate(deepstack):
                    record[f"deepstack_{k}"] = extra
            if "input_features" in inputs:
                mask = inputs["feature_attention_mask"]
                record["audio_embeds"] = thinker.get_audio_features(
                    inputs["input_features"], feature_attention_mask=mask
                )
            thinker.rope_deltas = None
            forward = thinker(**inputs, output_hidden_states=True)
            record["hidden_bf16"] = torch.stack([h[0] for h in forward.hidden_states])
            thinker.rope_deltas = None
            result, _ = model.generate(
                **inputs,
                return_audio=False,
                thinker_max_new_tokens=max_new,
                thinker_do_sample=False,
                thinker_return_dict_in_generate=True,
                thinker_output_scores=True,
            )
            generated = result.sequences[0, inputs["input_ids"].shape[1] :]
            scores = torch.stack([step[0].float() for step in result.scores])
            top2 = scores.topk(2, dim=-1).values
            record["generated_ids"] = generated
            record["generated_margins"] = top2[:, 0] - top2[:, 1]
            record["tf_logits_bf16"] = _teacher_forced(thinker, inputs, generated)
            # The reference against itself: its cached decode steps against one full forward.
            drift = (scores - record["tf_logits_bf16"]).abs()
            record["decode_drift"] = torch.where(scores.isfinite(), drift, 0.0).max(dim=-1).values
            record["tf_logits_fp32"] = _teacher_forced(thinker32, inputs32, generated)
        integer = {"input_ids", "generated_ids"}
        save_file(
            {
                k: v.detach().to(torch.int64 if k in integer else torch.float32).contiguous()
                for k, v in record.items()
            },
            str(out / f"{name}.safetensors"),
        )
        tokens = generated.tolist()
        cases[name] = {
            "generated_ids": tokens,
            "stopped_on_eos": bool(tokens and tokens[-1] == EOS),
            "min_margin": float(record["generated_margins"].min()),
        }
    return {
        "parameter_dtype": str(model.dtype).removeprefix("torch."),
        "buffers": _buffer_dtypes(model),
        "cases": cases,
    }
