"""Record the reference code2wav on seeded codes (transformers 4.57.3, ``qwen3_omni_moe``).

Runs inside the reference environment, never inside omni's. Usage::

    python code2wav_reference.py OUT_DIR

Reads ``OUT_DIR/request.json``: ``config`` (a tiny ``code2wav_config``),
``seed``, ``frames`` and ``batch`` (the codes' shape), ``chunk_size`` and
``left_context`` (for the release's chunked decode). Writes:

* ``OUT_DIR/code2wav.safetensors``: the module's ``state_dict`` (seeded
  random values, keys as in the release under ``code2wav.``);
* ``OUT_DIR/reference.npz``: ``codes`` ``[batch, Q, frames]`` (int64),
  ``full`` (the forward on all frames at once), ``chunked`` (its
  ``chunked_decode`` with the requested chunking, for information) and
  ``prefix/<n>`` (the forward on the first ``n`` frames, for each
  ``request["prefixes"]``);
* ``OUT_DIR/release_keys.json``: name -> shape of the ``state_dict`` of a
  code2wav at the reference's default (release) geometry, built on the meta
  device.
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

# The code2wav needs no torchvision; a build mismatched with torch breaks
# `import transformers` image utilities, so hide it rather than depend on it.
sys.modules.setdefault("torchvision", None)

import numpy as np  # noqa: E402
import torch  # noqa: E402
from safetensors.torch import save_file  # noqa: E402
from torch import nn  # noqa: E402
from transformers.models.qwen3_omni_moe.configuration_qwen3_omni_moe import (  # noqa: E402
    Qwen3OmniMoeCode2WavConfig,
)
from transformers.models.qwen3_omni_moe.modeling_qwen3_omni_moe import (  # noqa: E402
    Qwen3OmniMoeCode2Wav,
)

# Damping of the residual units' output convs and of the waveform head.
RESIDUAL_GAIN = 0.25
HEAD_GAIN = 0.05


def randomise(model: nn.Module, seed: int) -> None:
    """Seeded values with O(1) activations; the waveform head damped so audio is not clipped.

    The reference's own init leaves the decoder near-trivial (zero Snake
    parameters, 1e-6 ConvNeXt gammas), which would hide most of the
    computation from the comparison.
    """
    gen = torch.Generator().manual_seed(seed)
    last_conv = model.decoder[-1].conv
    residual_convs = {
        unit.conv2.conv for unit in model.modules() if type(unit).__name__.endswith("ResidualUnit")
    }
    with torch.no_grad():
        for _, module in sorted(model.named_modules(), key=lambda item: item[0]):
            for name, tensor in sorted(module.named_parameters(recurse=False)):
                if isinstance(module, nn.Embedding):
                    value = torch.randn(tensor.shape, generator=gen)
                elif tensor.dim() == 1:
                    value = 0.1 * torch.randn(tensor.shape, generator=gen)
                    if "norm" in type(module).__name__.lower() and name == "weight":
                        value += 1.0
                else:
                    fan_in = tensor[0].numel()
                    if isinstance(module, nn.ConvTranspose1d):
                        fan_in = tensor.shape[0] * tensor.shape[2] // module.stride[0]
                    value = torch.randn(tensor.shape, generator=gen) / math.sqrt(fan_in)
                    if module is last_conv:
                        value *= HEAD_GAIN
                    elif module in residual_convs:
                        value *= RESIDUAL_GAIN
                tensor.copy_(value)


def main() -> None:
    out = Path(sys.argv[1])
    request = json.loads((out / "request.json").read_text())
    torch.set_num_threads(1)

    config = Qwen3OmniMoeCode2WavConfig(**request["config"])
    config._attn_implementation = request.get("attn_implementation", "sdpa")
    torch.manual_seed(request["seed"])
    model = Qwen3OmniMoeCode2Wav(config).eval().float()
    randomise(model, request["seed"])
    save_file(
        {k: v.contiguous() for k, v in model.state_dict().items()},
        str(out / "code2wav.safetensors"),
    )

    gen = torch.Generator().manual_seed(request["seed"] + 1)
    shape = (request["batch"], config.num_quantizers, request["frames"])
    codes = torch.randint(0, config.codebook_size, shape, generator=gen)
    results: dict[str, np.ndarray] = {"codes": codes.numpy()}
    with torch.no_grad():
        results["full"] = model(codes).numpy()
        results["chunked"] = model.chunked_decode(
            codes, chunk_size=request["chunk_size"], left_context_size=request["left_context"]
        ).numpy()
        for frames in request.get("prefixes", []):
            results[f"prefix/{frames}"] = model(codes[..., :frames]).numpy()
    np.savez(out / "reference.npz", **results)

    with torch.device("meta"):
        release = Qwen3OmniMoeCode2Wav(Qwen3OmniMoeCode2WavConfig())
    keys = {k: list(v.shape) for k, v in release.state_dict().items()}
    (out / "release_keys.json").write_text(json.dumps(keys))


if __name__ == "__main__":
    main()
