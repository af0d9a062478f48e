"""The reference's side of ``bench_qwen3_omni_thinker.py``: run inside the reference environment.

Usage: ``python qwen3_omni_thinker_reference_runner.py JOB.json OUT.json`` with
the reference environment's python (transformers 4.57.3, which has
``qwen3_omni_moe``; see ``plugins/qwen3_tts/tests/REFERENCE.md``). It never
imports omni; the benchmark imports :func:`fill_parameter` from this file
(transformers is imported only in :func:`main`), so both sides write their
dummy weights with the same function.

It builds transformers' ``Qwen3OmniMoeThinkerForConditionalGeneration`` from
the job's sizes (sdpa attention, float32, parameter init switched off), fills
every parameter with :func:`fill_parameter` (a generator seeded by the
parameter's name: the same values on both sides without writing ~7 GB to
disk), casts the parameters to the job's ``dtype`` if it is ``bfloat16``
(buffers such as the rotary tables stay float32, as ``from_pretrained`` in
bfloat16 leaves them), and records for the benchmark:

* ``manifest``: name, shape and float64 sum of every parameter of ``model.``,
  ``lm_head.`` and ``visual.`` (the benchmark checks that its own modules have
  exactly these names and shapes, as a strict ``load_state_dict`` would, and
  the same sums, i.e. the same weights);
* per concurrency level: ``generate`` on that many prompts as one batch
  (greedy, exactly ``new_tokens`` each: EOS is off), with a streamer that
  stamps the time of every step (the prompt, then each generated token), the
  generated ids, and the time spent inside the decoder layers' attention and
  sparse-MoE blocks and the LM head between the first and the last token;
* time to first token with one image: ``generate(max_new_tokens=1)`` on the
  image prompt with ``pixel_values`` / ``image_grid_thw`` (the vision tower,
  the rope index, the prefill and the head all inside), from the call to the
  streamer's first token, best of ``ttft_repeats`` after a warm-up call;
* the process's peak resident memory.
"""

from __future__ import annotations

import json
import math
import resource
import sys
import time
import zlib
from pathlib import Path
from typing import Any

import torch


def fill_parameter(name: str, tensor: torch.Tensor, seed: int) -> None:
    """Seeded values with O(1) activations, by parameter name (both sides call this).

    1-D tensors: norm weights near 1, biases near 0. The MoE router gets a
    larger scale so that routing is decisive (no near-ties that rounding
    could flip between the two implementations); embeddings unit normal;
    every other matrix ``1/sqrt(fan_in)``.
    """
    gen = torch.Generator().manual_seed((seed * 1_000_003 + zlib.crc32(name.encode())) % (2**63))
    with torch.no_grad():
        if tensor.dim() == 1:
            if name.endswith("bias"):
                tensor.normal_(0.0, 0.02, generator=gen)
            else:
                tensor.normal_(1.0, 0.1, generator=gen)
            return
        fan_in = tensor[0].numel()
        if name.endswith("mlp.gate.weight"):
            std = 3.0 / math.sqrt(fan_in)
        elif name.endswith("embed_tokens.weight"):
            std = 1.0
        else:
            std = 1.0 / math.sqrt(fan_in)
        tensor.normal_(0.0, std, generator=gen)


def checksum(tensor: torch.Tensor) -> float:
    """The float64 sum of a tensor's values, a chunk at a time (no full float64 copy)."""
    flat = tensor.detach().reshape(-1)
    return float(sum(chunk.double().sum() for chunk in flat.split(1 << 22)))


COMPARED = ("model.", "lm_head.", "visual.")


class Clock:
    """A ``generate`` streamer that only stamps the time of each ``put``."""

    def __init__(self) -> None:
        self.times: list[float] = []
        self.on_first: Any = None

    def put(self, value: Any) -> None:
        self.times.append(time.perf_counter())
        if len(self.times) == 2 and self.on_first is not None:
            self.on_first()

    def end(self) -> None:
        pass


class Timers:
    """Seconds spent inside some modules (forward pre/post hooks), by label."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}
        self.calls: dict[str, int] = {}
        self._open: dict[int, float] = {}
        self._handles: list[Any] = []
        self.active = True  # hooks add up only while True

    def attach(self, module: torch.nn.Module, label: str) -> None:
        def before(mod: Any, args: Any) -> None:
            self._open[id(mod)] = time.perf_counter()

        def after(mod: Any, args: Any, out: Any) -> None:
            spent = time.perf_counter() - self._open.pop(id(mod))
            if not self.active:
                return
            self.seconds[label] = self.seconds.get(label, 0.0) + spent
            self.calls[label] = self.calls.get(label, 0) + 1

        self._handles.append(module.register_forward_pre_hook(before))
        self._handles.append(module.register_forward_hook(after))

    def detach(self) -> None:
        """Remove every hook (a compiled step measured next must not trace them)."""
        for handle in self._handles:
            handle.remove()
        self._handles = []

    def reset(self) -> None:
        self.seconds, self.calls = {}, {}


def main() -> None:
    job = json.loads(Path(sys.argv[1]).read_text())
    out_path = Path(sys.argv[2])
    torch.set_num_threads(int(job["threads"]))

    # Nothing here needs torchvision; a build of it that does not match the
    # machine (a CUDA wheel on a CPU host) fails at import inside
    # transformers' image utilities, so tell transformers it is absent.
    from transformers.utils import import_utils

    import_utils._torchvision_available = False
    from transformers.modeling_utils import no_init_weights
    from transformers.models.qwen3_omni_moe.configuration_qwen3_omni_moe import (
        Qwen3OmniMoeThinkerConfig,
    )
    from transformers.models.qwen3_omni_moe.modeling_qwen3_omni_moe import (
        Qwen3OmniMoeThinkerForConditionalGeneration,
    )

    text, vision, ids = job["text"], job["vision"], job["ids"]
    config = Qwen3OmniMoeThinkerConfig(
        # The audio tower is built by the class but never run: keep it tiny.
        audio_config={
            "encoder_layers": 1,
            "encoder_attention_heads": 2,
            "encoder_ffn_dim": 64,
            "d_model": 64,
            "output_dim": text["hidden_size"],
            "downsample_hidden_size": 32,
        },
        vision_config=vision,
        text_config={**text, "rope_scaling": {**text["rope_scaling"]}},
        **ids,
    )
    for part in (config, config.text_config, config.vision_config, config.audio_config):
        part._attn_implementation = "sdpa"
    started = time.perf_counter()
    with no_init_weights():
        model = Qwen3OmniMoeThinkerForConditionalGeneration(config)
    model = model.eval().requires_grad_(False)
    manifest = {}
    for name, param in model.named_parameters():
        fill_parameter(name, param.data, int(job["seed"]))
        if name.startswith(COMPARED):
            manifest[name] = [list(param.shape), checksum(param.data)]
    if job.get("dtype", "float32") == "bfloat16":  # after the manifest: sums of float32 values
        for param in model.parameters():
            param.data = param.data.to(torch.bfloat16)
    build_s = time.perf_counter() - started
    model.generation_config.eos_token_id = None
    model.generation_config.pad_token_id = 0

    timers = Timers()
    for layer in model.model.layers:
        timers.attach(layer.self_attn, "attention")
        timers.attach(layer.mlp, "moe")
    timers.attach(model.lm_head, "head")

    def generate(prompts: list[list[int]], new_tokens: int, **extra: Any) -> tuple[Any, Clock]:
        clock = Clock()
        clock.on_first = timers.reset  # count only what the decode steps spend
        input_ids = torch.tensor(prompts, dtype=torch.long)
        with torch.inference_mode():
            out = model.generate(
                input_ids=input_ids,
                attention_mask=torch.ones_like(input_ids),
                max_new_tokens=new_tokens,
                min_new_tokens=new_tokens,
                do_sample=False,
                streamer=clock,
                **extra,
            )
        return out[:, input_ids.shape[1] :], clock

    generate([job["warmup_prompt"]], 3)
    levels = []
    for level in job["levels"]:
        began = time.perf_counter()
        tokens, clock = generate(job["prompts"][:level], job["new_tokens"])
        levels.append(
            {
                "concurrency": level,
                "tokens": tokens.tolist(),
                "start": began,
                "stamps": clock.times[1:],  # one per generated token (per step)
                "steps": len(clock.times) - 1,
                "inside": dict(timers.seconds),
            }
        )

    image = job["image"]
    from safetensors.torch import load_file

    pixel_values = load_file(image["pixel_values"])["pixel_values"]
    grid = torch.tensor([image["grid_thw"]], dtype=torch.long)
    ttft, vision_s, first_token = [], [], None
    vision_timer = Timers()
    vision_timer.attach(model.visual, "vision")
    for attempt in range(1 + int(job["ttft_repeats"])):
        vision_timer.reset()
        began = time.perf_counter()
        tokens, clock = generate(
            [image["token_ids"]], 1, pixel_values=pixel_values, image_grid_thw=grid
        )
        if attempt:  # the first call warms up
            ttft.append(clock.times[1] - began)
            vision_s.append(vision_timer.seconds["vision"])
        first_token = int(tokens[0, 0])
    result = {
        "threads": torch.get_num_threads(),
        "dtype": str(next(model.parameters()).dtype).removeprefix("torch."),
        "build_s": build_s,
        "manifest": manifest,
        "levels": levels,
        "ttft_s": ttft,
        "ttft_vision_s": vision_s,
        "image_first_token": first_token,
        "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
    }
    out_path.write_text(json.dumps(result))


if __name__ == "__main__":
    main()
