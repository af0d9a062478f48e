"""Hands omni's prepared thinker prompt to SGLang's scheduler as one multimodal item.

omni's preprocessing and encoder stages have already done what an SGLang
multimodal processor usually does (templating, media decoding, encoding,
M-RoPE positions), so this processor only repacks: the request's
``image_data`` holds one dict (:func:`omni_qwen3_omni.thinker.sglang_adapter.prompt_payload`),
and it becomes a :class:`MultimodalDataItem` whose ``precomputed_embeddings``
are the encoder rows, with their positions, the deepstack rows and the
three-stream positions beside them. The tensors travel to the scheduler as
SGLang sends any multimodal feature.
"""

from __future__ import annotations

import hashlib

import torch
from sglang.srt.managers.schedule_batch import (
    Modality,
    MultimodalDataItem,
    MultimodalProcessorOutput,
)
from sglang.srt.multimodal.processors.base_processor import BaseMultimodalProcessor

from .thinker_model import PROMPT_ROWS, OmniQwen3OmniThinker

PAYLOAD_FORMAT = "omni-thinker-prompt"


class OmniThinkerPromptProcessor(BaseMultimodalProcessor):
    models = [OmniQwen3OmniThinker]

    async def process_mm_data_async(
        self, image_data, audio_data, input_text, request_obj, **kwargs
    ):
        payloads = [
            p
            for p in (image_data or [])
            if isinstance(p, dict) and p.get("format") == PAYLOAD_FORMAT
        ]
        if not payloads:
            return None
        if len(payloads) != 1 or len(image_data) != 1:
            raise ValueError("an omni thinker prompt carries exactly one prompt payload")
        payload = payloads[0]
        ids = list(request_obj.input_ids)
        rows = payload.get("embeddings")
        index = payload.get("embedding_index")
        if rows is None:  # positions only (a text prompt whose positions still count)
            rows = torch.zeros(0, 1)
            index = torch.zeros(0, dtype=torch.long)
        data = {PROMPT_ROWS + "_index": index}
        if payload.get("deepstack_rows") is not None:
            data["deepstack_rows"] = payload["deepstack_rows"]
            data["deepstack_index"] = payload["deepstack_index"]
        item = MultimodalDataItem(
            modality=Modality.IMAGE,
            precomputed_embeddings=rows,
            offsets=_runs(index.tolist()),
            model_specific_data=data,
        )
        # A stable content hash: the pad value that keeps prefix-cache keys apart.
        digest = hashlib.blake2b(digest_size=8)
        for tensor in (rows, index, payload["positions"]):
            digest.update(tensor.contiguous().numpy().tobytes())
        item.hash = int.from_bytes(digest.digest(), "little")
        item.pad_value = item.hash % (1 << 30)
        return MultimodalProcessorOutput(
            mm_items=[item],
            input_ids=ids,
            mrope_positions=payload["positions"],
            mrope_position_delta=torch.tensor([[int(payload["delta"])]]),
        )


def _runs(index: list[int]) -> list[tuple[int, int]]:
    """Inclusive ``(start, end)`` runs of consecutive positions (SGLang's item offsets)."""
    runs: list[tuple[int, int]] = []
    for position in index:
        if runs and runs[-1][1] == position - 1:
            runs[-1] = (runs[-1][0], position)
        else:
            runs.append((position, position))
    return runs
