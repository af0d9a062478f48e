"""What the float32 and bf16 parity tests of the understanding half share (opt-in, reference).

``reference/make_reference.py`` writes a tiny checkpoint with transformers'
own classes and records five cases (text; image; two images; audio; image +
audio). Both ``test_reference.py`` (float32, bit-for-bit) and
``test_reference_bf16.py`` (bfloat16, within the noise) need the same things
from it: the run itself, a case's manifest entry and tensors, the case's
messages as a client sends them, our parts loaded the way a stage loads them,
our prompts built by our own stages, and greedy tokens from the real engine.
They live here once. (Named apart from Qwen3-TTS's test helpers: both test
folders sit on ``sys.path`` in one session.)
"""

from __future__ import annotations

import base64
import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import anyio
import torch
from reference_support import run_reference

CASES = ["text", "image", "two_images", "audio", "image_audio"]
PARTS = ["audio_encoder", "image_encoder", "thinker"]
MAX_NEW = 32
SEED = 2  # every case's float32 greedy steps keep a top-1/top-2 logit margin above 3e-3


def run_understanding_reference(out: Path, **request: Any) -> tuple[Path, dict]:
    """Run ``make_reference.py`` into ``out``: (checkpoint directory, manifest + ``ref_dir``)."""
    path = out / "request.json"
    path.write_text(json.dumps({"max_new_tokens": MAX_NEW, "seed": SEED, **request}))
    run_reference("make_reference.py", str(out), str(path), timeout=900)
    manifest = json.loads((out / "ref" / "manifest.json").read_text())
    manifest["ref_dir"] = str(out / "ref")
    return out / "ckpt", manifest


def case_entry(manifest: dict, name: str) -> dict:
    by_name = {case["name"]: case for case in manifest["cases"]}
    assert name in by_name, f"the reference recorded no case {name!r}"
    return by_name[name]


def case_tensors(manifest: dict, name: str, folder: str = "") -> dict[str, torch.Tensor]:
    """The case's recorded tensors (``folder``: ``bf16`` for the bf16 run's)."""
    from safetensors.torch import load_file

    return load_file(str(Path(manifest["ref_dir"]) / folder / f"{name}.safetensors"))


def rel_l2(ours: torch.Tensor, ref: torch.Tensor) -> float:
    assert tuple(ours.shape) == tuple(ref.shape), (tuple(ours.shape), tuple(ref.shape))
    ours, ref = ours.double(), ref.double()
    return float((ours - ref).norm() / ref.norm().clamp_min(1e-30))


def _data_url(path: Path, mime: str) -> str:
    return f"data:{mime};base64," + base64.b64encode(path.read_bytes()).decode("ascii")


def openai_messages(case: dict, ref_dir: Path) -> list[dict]:
    """The case's messages as a client sends them: media as ``data:`` URLs of the saved files."""
    images, audios = iter(case["images"]), iter(case["audios"])
    out = []
    for message in case["messages"]:
        content = message["content"]
        if isinstance(content, list):
            parts = []
            for part in content:
                if part["type"] == "image":
                    url = _data_url(ref_dir / next(images), "image/png")
                    parts.append({"type": "image_url", "image_url": {"url": url}})
                elif part["type"] == "audio":
                    url = _data_url(ref_dir / next(audios), "audio/wav")
                    parts.append({"type": "audio_url", "audio_url": {"url": url}})
                else:
                    parts.append(part)
            content = parts
        out.append({"role": message["role"], "content": content})
    assert next(images, None) is None and next(audios, None) is None
    return out


def load_parts(ckpt: Path, dtype: str) -> dict[str, Any]:
    """Each understanding part as its stage loads it: ``load_part`` (strict) in ``dtype``."""
    from omni_qwen3_omni.loading import load_part

    loaded = {p: load_part(str(ckpt), p, "safetensors", dtype, "cpu") for p in PARTS}
    _, config, root = loaded["thinker"]
    return {"modules": {p: m for p, (m, _, _) in loaded.items()}, "config": config, "root": root}


def our_cases(ckpt: Path, manifest: dict, parts: dict) -> dict[str, dict[str, Any]]:
    """Per case: our preprocessing stage's output, the encoder stages' outputs, the prompt."""
    from omni_qwen3_omni.assemble import assemble, to_prompt
    from omni_qwen3_omni.preprocessing import create_preprocessing
    from omni_qwen3_omni.stages import AudioEncoder, ImageEncoder

    ref_dir = Path(manifest["ref_dir"])
    stage = create_preprocessing(str(ckpt))
    image_stage = ImageEncoder(parts["modules"]["image_encoder"], "cpu")
    audio_stage = AudioEncoder(parts["modules"]["audio_encoder"], "cpu")
    results = {}
    for name in CASES:
        request = SimpleNamespace(
            request_id=name,
            data={
                "messages": openai_messages(case_entry(manifest, name), ref_dir),
                "sampling": {"max_tokens": MAX_NEW, "temperature": 0},
            },
            params={},
        )
        pre = anyio.run(stage.run, request)
        encoders = {}
        if pre["images"]:
            encoders["image_encoder"] = image_stage._encode(pre["images"])
        if pre["audios"]:
            encoders["audio_encoder"] = audio_stage._encode(pre["audios"])
        wire = assemble(pre, encoders, parts["config"])
        results[name] = {"pre": pre, "encoders": encoders, "prompt": to_prompt(wire)}
    return results


def greedy(parts: dict, prompts: dict[str, Any]) -> dict[str, list[int]]:
    """Greedy tokens of every prompt, all submitted at once to one engine (four slots).

    The step model runs in the thinker's own dtype, as the thinker stage sets it.
    """
    from omni_core.engine.backends import create_engine
    from omni_core.engine.interface import EngineSettings, SamplingParams
    from omni_qwen3_omni.chat import ChatPrompter
    from omni_qwen3_omni.thinker.step import ThinkerStepModel

    lm = parts["modules"]["thinker"]
    model = ThinkerStepModel(
        lm,
        parts["config"].text,
        eos_ids=set(ChatPrompter.from_dir(parts["root"]).eos_token_ids),
        device=torch.device("cpu"),
        dtype=lm.model.embed_tokens.weight.dtype,
    )
    settings = EngineSettings(
        max_running_requests=4, max_total_tokens=4096, max_prefill_tokens=4096
    )
    tokens: dict[str, list[int]] = {name: [] for name in prompts}
    reasons: dict[str, str | None] = {}

    async def one(engine: Any, name: str) -> None:
        sampling = SamplingParams(temperature=0.0, max_new_tokens=MAX_NEW)
        async with engine.enqueue(name, prompts[name], sampling) as stream:
            async for token in stream:
                tokens[name].append(int(token))
        reasons[name] = stream.finish_reason

    async def main() -> None:
        engine = create_engine(model, settings, device="cpu")
        try:
            with anyio.fail_after(300):
                async with anyio.create_task_group() as tg:
                    for name in prompts:
                        tg.start_soon(one, engine, name)
        finally:
            await engine.aclose()

    anyio.run(main)
    for name, reason in reasons.items():
        assert reason in ("stop", "length"), (name, reason)
    return tokens


def first_difference(got: list[int], want: list[int]) -> int | None:
    """The first step where the two token lists differ (or one ends), None if equal."""
    for i, (a, b) in enumerate(zip(got, want, strict=False)):
        if a != b:
            return i
    return None if len(got) == len(want) else min(len(got), len(want))
