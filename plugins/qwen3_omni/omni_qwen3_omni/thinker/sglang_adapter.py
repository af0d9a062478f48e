"""The thinker on SGLang: what omni's SGLang backend needs from this plugin.

SGLang loads the release checkpoint directory itself, through omni's model
class (:mod:`omni_qwen3_omni.sglang_ext`, chosen with a model-config override,
so SGLang's own Qwen3-Omni class never runs). For ``load_format = "dummy"``
the seeded weights omni's loader makes are written to a private checkpoint
directory first, so both backends run the same weights (removed as soon as
SGLang has loaded it).

A prompt travels as token ids plus one payload in ``image_data`` (see
:mod:`omni_qwen3_omni.sglang_ext.thinker_processor`): the encoder rows and
their positions, the deepstack rows, the three-stream positions and the rope
delta of the first generated token. A request whose answer is spoken asks
SGLang for hidden states; each streamed token then comes with the talker's
rows of the positions its step consumed, as on the torch backend. A thinker
that feeds a talker runs without SGLang's prefix cache: a cache hit skips the
forward pass of the cached positions, whose rows the talker needs.
"""

from __future__ import annotations

import atexit
import json
import shutil
import tempfile
from pathlib import Path
from typing import Any

import torch

from omni_core.engine.interface import SamplingParams
from omni_core.engine.precision import DTYPE_NAMES
from omni_core.engine.prompt import EmbeddedPrompt

MODEL_PACKAGE = "omni_qwen3_omni.sglang_ext"
MODEL_CLASS = "OmniQwen3OmniThinker"
PAYLOAD_FORMAT = "omni-thinker-prompt"
#: factory.dtype spellings as SGLang's ``dtype`` names them (the canonical names).
_DTYPES = {"auto": "auto", **DTYPE_NAMES}


def sglang_environment() -> dict[str, str]:
    """What makes SGLang's processes find omni's model class and prompt processor."""
    return {
        "SGLANG_EXTERNAL_MODEL_PACKAGE": MODEL_PACKAGE,
        "SGLANG_EXTERNAL_MM_PROCESSOR_PACKAGE": MODEL_PACKAGE,
        "SGLANG_EXTERNAL_MM_MODEL_ARCH": MODEL_CLASS,
    }


def write_checkpoint(lm: Any, source: Path, prefix: str = "omni-sglang-thinker-") -> Path:
    """A checkpoint directory SGLang can load: ``source``'s configs and ``lm``'s weights."""
    from safetensors.torch import save_file

    directory = Path(tempfile.mkdtemp(prefix=prefix))
    try:
        for path in source.iterdir():
            if path.is_file() and not path.name.endswith((".safetensors", ".index.json")):
                shutil.copy(path, directory / path.name)
        tensors = {
            f"thinker.{k}": v.detach().contiguous().cpu() for k, v in lm.state_dict().items()
        }
        save_file(tensors, str(directory / "model.safetensors.partial"))
        (directory / "model.safetensors.partial").rename(directory / "model.safetensors")
    except BaseException:
        shutil.rmtree(directory, ignore_errors=True)
        raise
    return directory


def embedding_rows(directory: Path, ids: list[int]) -> torch.Tensor:
    """Rows ``ids`` of the checkpoint's thinker embedding table, read without loading it."""
    from safetensors import safe_open

    from ..checkpoint import Checkpoint

    name = "thinker.model.embed_tokens.weight"
    checkpoint = Checkpoint.open(directory)
    with safe_open(str(directory / checkpoint.weight_map[name]), framework="pt") as handle:
        table = handle.get_slice(name)
        return torch.stack([table[i : i + 1][0] for i in ids]).float()


class ThinkerSGLangModel:
    """The adapter :class:`omni_core.engine.sglang_engine.SGLangEngine` drives."""

    def __init__(
        self,
        checkpoint: Path,
        *,
        eos_ids: set[int],
        hidden_size: int,
        seed: int = 0,
        owned_directory: bool = False,
        dtype: str | None = None,
        feeds_talker: bool = False,
        tp_size: int = 1,
    ):
        self.checkpoint, self.eos_ids, self.hidden_size = checkpoint, set(eos_ids), hidden_size
        self.seed, self.owned = seed, owned_directory
        self.dtype = _DTYPES.get(str(dtype or "auto"), "auto")
        self.feeds_talker = feeds_talker
        self.tp_size = tp_size  # the stage's: SGLang starts that many scheduler ranks
        self.captured: dict[str, int] = {}
        if owned_directory:
            atexit.register(self.close)

    # -- the talker's rows, as ThinkerStepModel offers them -------------------------
    def capture(self, request_id: str, accept_layer: int) -> None:
        self.captured[request_id] = accept_layer

    def release(self, request_id: str) -> None:
        self.captured.pop(request_id, None)

    # -- SGLangModel ----------------------------------------------------------------
    def launch(self) -> tuple[dict[str, Any], dict[str, str]]:
        args = {
            "model_path": str(self.checkpoint),
            "skip_tokenizer_init": True,
            "json_model_override_args": json.dumps({"architectures": [MODEL_CLASS]}),
            "enable_return_hidden_states": True,
            "random_seed": self.seed,
            "dtype": self.dtype,  # the stage's factory.dtype (engine.dtype is omni's to set)
            "tp_size": self.tp_size,  # the stage's tp_size (placement's; see sglang_settings)
        }
        if self.feeds_talker:
            # The talker reads every prompt position's hidden states; a prefix-cache hit
            # skips the cached positions' forward pass, so their rows would never exist.
            args["disable_radix_cache"] = True
        return args, sglang_environment()

    def prompt_length(self, prompt: Any) -> int:
        return len(_as_prompt(prompt))

    def request(self, request_id: str, prompt: Any, sampling: SamplingParams) -> dict[str, Any]:
        prompt = _as_prompt(prompt)
        params: dict[str, Any] = {
            "temperature": sampling.temperature,
            "top_p": sampling.top_p,
            "top_k": sampling.top_k if sampling.top_k > 0 else -1,
            "repetition_penalty": sampling.repetition_penalty,
            "max_new_tokens": sampling.max_new_tokens,
            "stop_token_ids": sorted(self.eos_ids),
        }
        if sampling.seed is not None:
            params["sampling_seed"] = int(sampling.seed)
        fields: dict[str, Any] = {"input_ids": list(prompt.token_ids), "sampling_params": params}
        if not _plain_text(prompt):
            fields["image_data"] = [payload(prompt)]
        if request_id in self.captured:
            fields["return_hidden_states"] = True
        return fields

    def outputs(self, request_id: str, chunk: dict[str, Any], sent: int) -> list[Any]:
        ids = chunk.get("output_ids") or []
        new = ids[sent:]
        if request_id not in self.captured or not new:
            return list(new)
        hidden = (chunk.get("meta_info") or {}).get("hidden_states") or []
        out = []
        for k, token in enumerate(new, start=sent):
            rows = torch.tensor(hidden[k], dtype=torch.float32)
            rows = rows.reshape(-1, 2 * self.hidden_size)
            out.append(
                {"token": token, "rows": (rows[:, : self.hidden_size], rows[:, self.hidden_size :])}
            )
        return out

    def finished(self, request_id: str) -> None:
        self.release(request_id)

    def loaded(self) -> None:
        """SGLang has read the checkpoint (or failed to): a dummy one written for it goes
        now, so no later crash of this process can leave it behind."""
        self.close()

    def close(self) -> None:
        if self.owned:
            shutil.rmtree(self.checkpoint, ignore_errors=True)


def payload(prompt: EmbeddedPrompt) -> dict[str, Any]:
    """The prompt's rows and positions for :mod:`omni_qwen3_omni.sglang_ext.thinker_processor`."""
    length = len(prompt)
    positions = prompt.positions
    if positions is None:
        positions = torch.arange(length)[None].expand(3, length)
    data: dict[str, Any] = {
        "format": PAYLOAD_FORMAT,
        "positions": positions.to(torch.long).contiguous(),
        "delta": prompt.first_decode_position - length,
        "embeddings": None,
        "embedding_index": None,
    }
    if prompt.embeddings is not None:
        data["embeddings"] = prompt.embeddings.float().contiguous()
        data["embedding_index"] = prompt.embedding_index.to(torch.long).contiguous()
    if prompt.layer_additions:
        data["deepstack_rows"] = torch.cat([r.float() for r in prompt.layer_additions], -1)
        data["deepstack_index"] = prompt.addition_index.to(torch.long).contiguous()
    return data


def _plain_text(prompt: EmbeddedPrompt) -> bool:
    """No rows and positions ``0..n-1``: SGLang's own text path computes the same."""
    if prompt.embeddings is not None or prompt.layer_additions:
        return False
    if prompt.first_decode_position != len(prompt):
        return False
    if prompt.positions is None:
        return True
    expected = torch.arange(len(prompt))[None].expand(prompt.positions.shape[0], -1)
    return bool(torch.equal(prompt.positions.to(torch.long).cpu(), expected))


def _as_prompt(prompt: Any) -> EmbeddedPrompt:
    if isinstance(prompt, EmbeddedPrompt):
        return prompt
    raise TypeError(f"the thinker takes an EmbeddedPrompt, got {type(prompt).__name__}")
