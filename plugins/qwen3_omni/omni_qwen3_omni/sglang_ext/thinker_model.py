"""``OmniQwen3OmniThinker``: SGLang's Qwen3-MoE decoder with omni's prompt rows spliced in.

What differs from a text model, all in :meth:`OmniQwen3OmniThinker.forward`:

* **Embedding rows.** A prompt's audio and image positions hold rows the
  encoder stages computed (``EmbeddedPrompt.embeddings``). They reach this
  process as one multimodal item per request (see :mod:`.thinker_processor`)
  and replace the token embeddings at their positions; under chunked prefill
  or a prefix-cache hit only the rows of the positions this step extends are
  used.
* **Deepstack.** The vision tower's inner features are added after the first
  decoder layers at the image positions, through the decoder's own
  ``input_deepstack_embeds`` (``[tokens, layers * hidden]``, zero elsewhere).
* **Positions.** Three-stream M-RoPE positions come with the item
  (``mrope_positions``, ``mrope_position_delta``): SGLang's scheduler expands
  them for prefill and decode. Rotary sections are interleaved, as the
  release's thinker builds them whatever its config says.
* **The talker's rows.** When a request asks for hidden states (omni asks
  for the ones that will be spoken), the packed ``[layer-0 input | output of
  accept_hidden_layer]`` of each position is what SGLang returns as that
  request's hidden states.
"""

from __future__ import annotations

from array import array
from collections.abc import Iterable

import torch
from sglang.srt.layers.logits_processor import LogitsProcessor
from sglang.srt.layers.moe.fused_moe_triton.layer import FusedMoE
from sglang.srt.layers.vocab_parallel_embedding import ParallelLMHead
from sglang.srt.model_executor.forward_batch_info import ForwardBatch
from sglang.srt.model_loader.weight_utils import default_weight_loader
from sglang.srt.models.qwen3_vl_moe import Qwen3MoeLLMModel
from sglang.srt.utils import add_prefix
from torch import nn

#: The item key omni's rows travel under (see :mod:`.thinker_processor`).
PROMPT_ROWS = "omni_prompt_rows"

_STACKED = (  # (SGLang's fused parameter, the checkpoint's part, shard)
    (".qkv_proj", ".q_proj", "q"),
    (".qkv_proj", ".k_proj", "k"),
    (".qkv_proj", ".v_proj", "v"),
    (".gate_up_proj", ".gate_proj", 0),
    (".gate_up_proj", ".up_proj", 1),
)


class OmniQwen3OmniThinker(nn.Module):
    """The thinker's text decoder and LM head over SGLang's layers (see the module doc)."""

    def __init__(self, config, quant_config=None, prefix: str = ""):
        super().__init__()
        text = config.thinker_config.text_config
        scaling = dict(getattr(text, "rope_scaling", None) or {})
        if "mrope_section" in scaling:
            scaling.update(mrope_interleaved=True, interleaved=True)
            text.rope_scaling = scaling
        text.tie_word_embeddings = bool(getattr(config, "tie_word_embeddings", False))
        self.config = text
        self.hidden_size = text.hidden_size
        self.vocab_size = text.vocab_size
        self.model = Qwen3MoeLLMModel(
            config=text, quant_config=quant_config, prefix=add_prefix("model", prefix)
        )
        self.lm_head = ParallelLMHead(
            text.vocab_size,
            text.hidden_size,
            quant_config=quant_config,
            prefix=add_prefix("lm_head", prefix),
        )
        self.logits_processor = LogitsProcessor(text)
        vision = getattr(config.thinker_config, "vision_config", None)
        self.deepstack_layers = len(getattr(vision, "deepstack_visual_indexes", None) or [])
        self.model.deepstack_embed_to_decoder_layer = range(self.deepstack_layers)
        talker = getattr(config, "talker_config", None)
        self.accept_layer = int(getattr(talker, "accept_hidden_layer", text.num_hidden_layers))
        self.is_mrope_enabled = "mrope_section" in scaling

    # SGLang's scheduler pads a multimodal item's positions with the item's hash so that
    # prefix-cache keys differ between prompts whose placeholders hold different rows.
    def pad_input_ids(self, input_ids, mm_inputs) -> array:
        ids = array("q", input_ids)
        for item in mm_inputs.mm_items:
            index = item.model_specific_data.get(PROMPT_ROWS + "_index")
            if index is None or item.pad_value is None:
                continue
            for position in index.tolist():
                ids[position] = item.pad_value
        return ids

    def get_input_embeddings(self) -> nn.Module:
        return self.model.embed_tokens

    def _capture(self, forward_batch: ForwardBatch) -> bool:
        mode = forward_batch.capture_hidden_mode
        return mode is not None and mode.need_capture()

    def forward(self, input_ids, positions, forward_batch: ForwardBatch, **kwargs):
        if self.is_mrope_enabled and forward_batch.mrope_positions is not None:
            positions = forward_batch.mrope_positions
        embeds = self.model.embed_tokens(input_ids.clamp(0, self.vocab_size - 1))
        deepstack = None
        if forward_batch.forward_mode.is_extend() and forward_batch.mm_inputs:
            embeds, deepstack = self._splice(embeds, forward_batch)
        capture = self._capture(forward_batch)
        self.model.layers_to_capture = (
            sorted({0, self.accept_layer})
            if capture and self.accept_layer < len(self.model.layers)
            else ([0] if capture else [])
        )
        out = self.model(
            input_ids,
            positions,
            forward_batch,
            input_embeds=embeds,
            input_deepstack_embeds=deepstack,
        )
        aux = None
        if isinstance(out, tuple):
            hidden, captured = out
            rows = list(captured)
            if len(rows) == 1:  # the accept layer is the final (normed) output
                rows.append(hidden)
            aux = torch.cat([rows[0], rows[-1]], dim=-1)
        else:
            hidden = out
        return self.logits_processor(input_ids, hidden, self.lm_head, forward_batch, aux)

    def _splice(self, embeds: torch.Tensor, forward_batch: ForwardBatch):
        """Rows of omni's prompts at the positions this extend step covers; deepstack too."""
        deepstack = None
        starts = forward_batch.extend_prefix_lens_cpu
        lengths = forward_batch.extend_seq_lens_cpu
        offset = 0
        for mm, start, length in zip(forward_batch.mm_inputs, starts, lengths, strict=True):
            start, length = int(start), int(length)
            for item in mm.mm_items if mm is not None else ():
                data = item.model_specific_data
                if PROMPT_ROWS + "_index" in data:
                    _place(
                        embeds,
                        data[PROMPT_ROWS + "_index"],
                        item.precomputed_embeddings,
                        start,
                        length,
                        offset,
                    )
                if data.get("deepstack_index") is not None and self.deepstack_layers:
                    if deepstack is None:
                        deepstack = embeds.new_zeros(
                            embeds.shape[0], self.deepstack_layers * self.hidden_size
                        )
                    _place(
                        deepstack,
                        data["deepstack_index"],
                        data["deepstack_rows"],
                        start,
                        length,
                        offset,
                    )
            offset += length
        return embeds, deepstack

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        """The release's ``thinker.`` subtree (one module per expert); the rest is skipped."""
        params = dict(self.named_parameters())
        experts = FusedMoE.make_expert_params_mapping(
            ckpt_gate_proj_name="gate_proj",
            ckpt_down_proj_name="down_proj",
            ckpt_up_proj_name="up_proj",
            num_experts=self.config.num_experts,
        )
        loaded: set[str] = set()
        for name, weight in weights:
            if not name.startswith("thinker."):
                continue
            name = name.removeprefix("thinker.")
            if not name.startswith(("model.", "lm_head.")):
                continue  # the towers run in omni's encoder stages
            if ".mlp.experts." in name:
                for param_name, part, expert, shard in experts:
                    if part in name:
                        target = name.replace(part, param_name)
                        param = params[target]
                        param.weight_loader(param, weight, target, shard_id=shard, expert_id=expert)
                        loaded.add(target)
                        break
                continue
            for fused, part, shard in _STACKED:
                if part in name:
                    target = name.replace(part, fused)
                    param = params[target]
                    param.weight_loader(param, weight, shard)
                    loaded.add(target)
                    break
            else:
                param = params[name]
                getattr(param, "weight_loader", default_weight_loader)(param, weight)
                loaded.add(name)
        missing = sorted(set(params) - loaded)
        if missing:
            raise ValueError(
                f"the checkpoint has no weights for {len(missing)} thinker parameters "
                f"(first: {missing[0]})"
            )


def _place(target, index, rows, start: int, length: int, offset: int) -> None:
    """Write ``rows[j]`` at prompt position ``index[j]`` if this step extends it."""
    index = index.to(target.device)
    inside = (index >= start) & (index < start + length)
    if bool(inside.any()):
        rows = rows.to(target.device, target.dtype)[inside]
        target[offset + index[inside] - start, : rows.shape[1]] = rows


EntryClass = OmniQwen3OmniThinker
