"""Record the reference audio front end and audio tower on given clips (transformers 4.57.3).

Runs inside the reference environment, never inside omni's. Usage::

    python audio_reference.py OUT_DIR

Reads ``OUT_DIR/request.json`` (the tower's tiny config, seed, clip names) and
``OUT_DIR/inputs.npz`` (the float32 16 kHz clips, written by our test so both
sides see the same samples). Writes ``OUT_DIR/audio_tower.safetensors`` (the
tower's ``state_dict`` with seeded random values, keys as in the module) and
``OUT_DIR/reference.npz``:

* ``mel/<clip>``: the processor-style features of the clip alone, valid frames
  only (``padding=True, return_attention_mask=True``, as Qwen3-Omni calls it);
* ``batch_mel/<i>``: the clips of ``request["mel_batch"]`` featurised in one
  call, each cut to its attention mask;
* ``tokens/<clip>``: the placeholder count of ``_get_feat_extract_output_lengths``;
* ``plain/<clip>``: the tower's output for the clip alone (sdpa, no mask --
  everything attends to everything);
* ``windowed/<i>``: the tower's output for the ``request["windowed"]`` clip
  groups, one call per group with the clips concatenated, every layer given the
  block mask the reference's own ``_prepare_attention_mask`` builds from its
  ``cu_seqlens`` (what its flash-attention path computes), split per clip.
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

# The audio path needs no torchvision; a build mismatched with torch breaks
# `import transformers` image utilities, so hide it rather than depend on it.
sys.modules.setdefault("torchvision", None)

import numpy as np  # noqa: E402
import torch  # noqa: E402
from safetensors.torch import save_file  # noqa: E402
from transformers import WhisperFeatureExtractor  # noqa: E402
from transformers.models.qwen3_omni_moe.configuration_qwen3_omni_moe import (  # noqa: E402
    Qwen3OmniMoeAudioEncoderConfig,
)
from transformers.models.qwen3_omni_moe.modeling_qwen3_omni_moe import (  # noqa: E402
    Qwen3OmniMoeAudioEncoder,
    _get_feat_extract_output_lengths,
)


def randomise(module: torch.nn.Module, seed: int) -> None:
    """Seeded values with O(1) activations (the reference's own init is near-trivial)."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, tensor in sorted(module.state_dict().items()):
            if tensor.dim() == 1:
                tensor.copy_(0.1 * torch.randn(tensor.shape, generator=gen))
                if "norm" in name and name.endswith("weight"):
                    tensor.add_(1.0)
            else:
                fan_in = tensor[0].numel()
                tensor.copy_(torch.randn(tensor.shape, generator=gen) / math.sqrt(fan_in))


def featurise(extractor: WhisperFeatureExtractor, clips: list[np.ndarray]) -> list[np.ndarray]:
    got = extractor(
        clips if len(clips) > 1 else clips[0],
        sampling_rate=16000,
        padding=True,
        return_attention_mask=True,
        return_tensors="np",
    )
    frames = got["attention_mask"].sum(-1)
    return [got["input_features"][i, :, : int(n)] for i, n in enumerate(frames)]


def with_block_masks(encoder: Qwen3OmniMoeAudioEncoder) -> None:
    """Give every layer the reference's own cu_seqlens block mask (its FA2 windows)."""
    for layer in encoder.layers:
        plain = layer.forward

        def masked(hidden_states, cu_seqlens, attention_mask=None, _plain=plain, **kwargs):
            mask = encoder._prepare_attention_mask(hidden_states, cu_seqlens)
            return _plain(hidden_states, cu_seqlens, attention_mask=mask, **kwargs)

        layer.forward = masked


def encode(encoder: Qwen3OmniMoeAudioEncoder, mels: list[np.ndarray]) -> list[np.ndarray]:
    lens = torch.tensor([m.shape[1] for m in mels])
    feats = torch.from_numpy(np.concatenate(mels, axis=1))
    with torch.no_grad():
        out = encoder(input_features=feats, feature_lens=lens).last_hidden_state
    counts = _get_feat_extract_output_lengths(lens).tolist()
    return [t.numpy() for t in out.split(counts)]


def main() -> None:
    out = Path(sys.argv[1])
    request = json.loads((out / "request.json").read_text())
    torch.set_num_threads(1)
    clips = dict(np.load(out / "inputs.npz"))

    extractor = WhisperFeatureExtractor(feature_size=128, sampling_rate=16000)
    results: dict[str, np.ndarray] = {}
    mels = {}
    for name, wave in clips.items():
        mels[name] = featurise(extractor, [wave])[0]
        results[f"mel/{name}"] = mels[name]
        frames = torch.tensor(mels[name].shape[1])
        results[f"tokens/{name}"] = np.array(int(_get_feat_extract_output_lengths(frames)))
    batch = featurise(extractor, [clips[n] for n in request["mel_batch"]])
    for i, mel in enumerate(batch):
        results[f"batch_mel/{i}"] = mel

    config = Qwen3OmniMoeAudioEncoderConfig(**request["config"])
    config._attn_implementation = request.get("attn_implementation", "sdpa")
    torch.manual_seed(request["seed"])
    encoder = Qwen3OmniMoeAudioEncoder(config).eval().float()
    randomise(encoder, request["seed"])
    save_file(
        {k: v.contiguous() for k, v in encoder.state_dict().items()},
        str(out / "audio_tower.safetensors"),
    )
    for name in request["plain"]:
        results[f"plain/{name}"] = encode(encoder, [mels[name]])[0]
    with_block_masks(encoder)
    for g, group in enumerate(request["windowed"]):
        for i, emb in enumerate(encode(encoder, [mels[n] for n in group])):
            results[f"windowed/{g}/{i}"] = emb
    np.savez(out / "reference.npz", **results)


if __name__ == "__main__":
    main()
