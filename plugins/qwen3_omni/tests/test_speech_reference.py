"""Spoken answers against transformers' ``qwen3_omni_moe``, end to end (opt-in: ``-m reference``).

``reference/speech_reference.py`` runs in the reference environment
(transformers 4.57.3): it saves a tiny seeded
``Qwen3OmniMoeForConditionalGeneration`` (thinker, talker and code2wav all
unlike our ``tiny`` preset) with ``save_pretrained`` and the processor's
files, and records ``generate(..., return_audio=True, speaker=...)``,
greedy (its code predictor forced greedy), for a text-only prompt and an
image + audio prompt, each spoken by two speakers (Ethan, Chelsie): the
thinker's tokens and text, the talker's codes frame by frame (30 frames:
``talker_max_new_tokens`` 31, and the release makes a frame for every talker
token but the last) and the unchunked code2wav forward of those codes.

1. Through the real serving path: the ``qwen3-omni`` pipeline, seven
   processes planned with ``--placement.policy cpu`` on the reference's
   checkpoint directory (every loading stage ``safetensors``, ``float32``;
   ``talker_ar.factory.max_frames`` 30), requests as a client sends them
   (media as ``data:`` URLs, ``temperature`` 0, ``modalities`` text + audio,
   ``voice``), each alone and then all four at once. Compared at the
   runtime's edge: the decode stage's text equals the reference's greedy
   tokens decoded by the reference processor's tokenizer (special tokens
   skipped), with the same completion-token count; the code2wav stage's
   chunks, concatenated, have the reference's length and are within 1e-4
   relative L2 of its unchunked waveform; code2wav reports the same frame
   count. (Codes are not visible at the edge: equal audio implies them in
   practice, and 2. checks them directly.)
2. In process, the same parts: ``load_part`` each part, our preprocessing
   stage and encoder wrappers, the thinker's ``ThinkerStepModel`` on the
   engine with :meth:`capture`, its rows fed to ``TalkerPrompt`` as the talker
   stage feeds them, ``TalkerStepModel`` on the engine (all four requests
   batched on both engines): the thinker's token ids equal the reference's,
   the talker's frames equal its codes frame for frame, and
   ``Code2Wav.decode`` of our frames is within 1e-4 of its waveform.

A mismatch names the step or frame and the reference's greedy margin there.
Greedy on both sides; the thinker uses no repetition penalty (the
reference's ``generate`` reads the thinker's own generation config, which has
none, not ``generation_config.json``), so the requests say
``repetition_penalty: 1.0`` explicitly; the talker keeps the release's 1.05
on both sides.

Skipped unless ``QWEN_TTS_REF_PYTHON`` names the reference environment's python.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import anyio
import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("safetensors")
pytest.importorskip("PIL")

from safetensors.torch import load_file  # noqa: E402
from understanding_support import openai_messages, rel_l2  # noqa: E402

from omni_core.engine.backends import create_engine  # noqa: E402
from omni_core.engine.interface import EngineSettings, SamplingParams  # noqa: E402
from omni_core.plugins import OmniPlugins  # noqa: E402
from omni_core.testing import plan_on_cpu  # noqa: E402
from omni_qwen3_omni.assemble import assemble, to_prompt  # noqa: E402
from omni_qwen3_omni.chat import ChatPrompter  # noqa: E402
from omni_qwen3_omni.loading import load_part, read_raw_config  # noqa: E402
from omni_qwen3_omni.preprocessing import create_preprocessing  # noqa: E402
from omni_qwen3_omni.stages import AudioEncoder, ImageEncoder  # noqa: E402
from omni_qwen3_omni.talker.config import TalkerConfig  # noqa: E402
from omni_qwen3_omni.talker.prompt import TalkerPrompt  # noqa: E402
from omni_qwen3_omni.talker.step import TALKER_SAMPLING, TalkerStepModel  # noqa: E402
from omni_qwen3_omni.thinker.step import ThinkerStepModel  # noqa: E402

REFERENCE_PYTHON = Path(os.environ.get("QWEN_TTS_REF_PYTHON", "/nonexistent/qwen-tts-ref"))
SCRIPT = Path(__file__).parent / "reference" / "speech_reference.py"
CASES = ["text_ethan", "text_chelsie", "image_audio_ethan", "image_audio_chelsie"]
SEED = 3
THINKER_TOKENS = 12
TALKER_TOKENS = 31  # the reference's limit counts talker tokens: 30 frames
FRAMES = TALKER_TOKENS - 1
MIN_FRAMES = 24
REL_L2 = 1e-4
LOADED = ["image_encoder", "audio_encoder", "thinker", "talker_ar", "code2wav"]

pytestmark = [
    pytest.mark.reference,
    pytest.mark.skipif(
        not REFERENCE_PYTHON.exists(),
        reason="opt-in: set QWEN_TTS_REF_PYTHON to the reference environment's python "
        "(make test-reference does)",
    ),
]


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


# -- the reference, run once --------------------------------------------------------


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict]:
    """(checkpoint directory, manifest with ``ref_dir`` and ``by_name`` added)."""
    out = tmp_path_factory.mktemp("qwen3_omni_speech_reference")
    request = out / "request.json"
    request.write_text(
        json.dumps(
            {
                "seed": SEED,
                "thinker_max_new_tokens": THINKER_TOKENS,
                "talker_max_new_tokens": TALKER_TOKENS,
            }
        )
    )
    proc = subprocess.run(
        [str(REFERENCE_PYTHON), str(SCRIPT), str(out), str(request)],
        capture_output=True,
        text=True,
        timeout=900,
        env={**os.environ, "PYTHONWARNINGS": "ignore", "OMP_NUM_THREADS": "1"},
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    manifest = json.loads((out / "ref" / "manifest.json").read_text())
    manifest["ref_dir"] = str(out / "ref")
    manifest["by_name"] = {case["name"]: case for case in manifest["cases"]}
    assert sorted(manifest["by_name"]) == sorted(CASES)
    return out / "ckpt", manifest


def _tensors(manifest: dict, name: str) -> dict[str, torch.Tensor]:
    return load_file(str(Path(manifest["ref_dir"]) / f"{name}.safetensors"))


def _request(case: dict, ref_dir: Path) -> dict[str, Any]:
    """What a client sends for the case: OpenAI-style messages, greedy, text and audio out."""
    return {
        "messages": openai_messages(case, ref_dir),
        "sampling": {"max_tokens": THINKER_TOKENS, "temperature": 0, "repetition_penalty": 1.0},
        "modalities": ["text", "audio"],
        "voice": case["speaker"],
    }


def test_the_reference_speaks_long_enough_and_differs_from_the_preset(reference):
    ckpt, manifest = reference
    assert manifest["transformers_version"] == "4.57.3"
    for case in manifest["cases"]:
        name = case["name"]
        assert len(case["generated_ids"]) == THINKER_TOKENS or case["thinker_stopped_on_eos"]
        assert case["frames"] >= MIN_FRAMES, name
        assert case["samples"] == 1920 * case["frames"] - 555, name
        assert case["wav_clipped"] == 0 and case["wav_rms"] > 1e-2, name
        assert case["distinct_code0"] >= 8, name  # not a repeated token
    # The two speakers of one input get the same words and different voices.
    by = manifest["by_name"]
    for text in ("text", "image_audio"):
        ethan, chelsie = by[f"{text}_ethan"], by[f"{text}_chelsie"]
        assert ethan["generated_ids"] == chelsie["generated_ids"]
        assert not torch.equal(
            _tensors(manifest, f"{text}_ethan")["codes"],
            _tensors(manifest, f"{text}_chelsie")["codes"],
        )
    from omni_qwen3_omni.source import resolve_model_path

    ours = TalkerConfig.from_dict(read_raw_config(ckpt))
    tiny = TalkerConfig.from_dict(read_raw_config(resolve_model_path("tiny").path))
    for get in (
        lambda c: c.text.hidden_size,
        lambda c: c.text.num_hidden_layers,
        lambda c: c.text.num_experts,
        lambda c: c.text.norm_topk_prob,
        lambda c: c.num_code_groups,
        lambda c: c.code_predictor.vocab_size,
        lambda c: c.accept_hidden_layer,
    ):
        assert get(ours) != get(tiny)


def _frame_mismatch(name: str, got: list[torch.Tensor], ref: dict[str, torch.Tensor]) -> str | None:
    codes = ref["codes"]
    if len(got) != codes.shape[0]:
        return f"{name}: {len(got)} frames, the reference made {codes.shape[0]}"
    for k, frame in enumerate(got):
        if not torch.equal(frame.to(torch.long), codes[k]):
            return (
                f"{name}: frame {k} differs: ours {frame.tolist()}, reference "
                f"{codes[k].tolist()} (reference margins there: codebook 0 "
                f"{float(ref['code0_margins'][k]):.2e}, predictor "
                f"{float(ref['predictor_margins'][k].min()):.2e})"
            )
    return None


def _token_mismatch(
    name: str, got: list[int], case: dict, ref: dict[str, torch.Tensor]
) -> str | None:
    want = case["generated_ids"]
    for k, (a, b) in enumerate(zip(got, want, strict=False)):
        if a != b:
            return (
                f"{name}: thinker token {k} differs (reference margin there "
                f"{float(ref['thinker_margins'][k]):.2e})\nours {got}\nref  {want}"
            )
    if len(got) != len(want):
        return f"{name}: {len(got)} thinker tokens, the reference made {len(want)}"
    return None


# -- 1. the real serving path -------------------------------------------------------


def _flags(ckpt: Path) -> list[str]:
    flags = ["--model-path", str(ckpt), "--talker_ar.factory.max_frames", str(FRAMES)]
    for stage in LOADED:
        flags += [f"--{stage}.factory.load_format", "safetensors"]
        flags += [f"--{stage}.factory.dtype", "float32"]
    return flags


async def _speak(runtime: Any, data: dict) -> dict[str, Any]:
    """The decode stage's text and trailer, the code2wav stage's chunks and trailer."""
    handle = await runtime.dispatch(data)
    text, chunks, finals = [], [], {}
    async for event in handle.stream():
        if event.final:
            finals[event.stage] = event.data
        elif event.stage == "decode":
            text.append(event.data)
        elif event.stage == "code2wav":
            chunk = np.asarray(event.data)
            assert chunk.dtype == np.float32 and chunk.ndim == 1, (chunk.dtype, chunk.shape)
            chunks.append(chunk)
    return {"text": "".join(text), "chunks": chunks, "finals": finals}


def _check_answer(name: str, got: dict[str, Any], manifest: dict) -> float:
    case, ref = manifest["by_name"][name], _tensors(manifest, name)
    decode, code2wav = got["finals"].get("decode"), got["finals"].get("code2wav")
    assert decode is not None and code2wav is not None, (name, sorted(got["finals"]))
    assert got["text"] == case["text"], f"{name}: ours {got['text']!r}\nref  {case['text']!r}"
    assert decode["usage"]["completion_tokens"] == len(case["generated_ids"]), name
    assert decode["finish_reason"] == ("stop" if case["thinker_stopped_on_eos"] else "length")
    assert code2wav["frames"] == case["frames"], (name, code2wav)
    assert code2wav["sample_rate"] == 24000
    assert len(got["chunks"]) > 1, f"{name}: the audio was not streamed"
    wav = torch.from_numpy(np.concatenate(got["chunks"]))
    assert wav.numel() == code2wav["samples"] == case["samples"], (name, wav.numel())
    error = rel_l2(wav, ref["wav"])
    assert error <= REL_L2, f"{name}: streamed waveform rel L2 {error:.2e}"
    return error


@pytest.mark.anyio
async def test_the_pipeline_speaks_as_the_reference(reference, short_tmp):
    ckpt, manifest = reference
    ref_dir = Path(manifest["ref_dir"])
    planned = plan_on_cpu(
        OmniPlugins(env={}), short_tmp / "speech", pipeline="qwen3-omni", flags=_flags(ckpt)
    )
    assert len(planned.plan.processes) == 7
    requests = {name: _request(manifest["by_name"][name], ref_dir) for name in CASES}
    together: dict[str, Any] = {}
    with anyio.fail_after(600):
        async with planned.runtime() as runtime:
            alone = {name: await _speak(runtime, requests[name]) for name in CASES}

            async def one(name: str) -> None:
                together[name] = await _speak(runtime, requests[name])

            async with anyio.create_task_group() as tg:
                for name in CASES:
                    tg.start_soon(one, name)
    for label, answers in (("alone", alone), ("together", together)):
        errors = {name: _check_answer(name, answers[name], manifest) for name in CASES}
        print(
            f"{label}: streamed waveform rel L2 "
            + ", ".join(f"{k} {v:.1e}" for k, v in errors.items())
        )


# -- 2. in process: token ids and codes directly -------------------------------------


def _parts(ckpt: Path) -> dict[str, Any]:
    return {part: load_part(str(ckpt), part, "safetensors", "float32", "cpu")[0] for part in LOADED}


def _prompts(ckpt: Path, manifest: dict, parts: dict[str, Any]) -> dict[str, Any]:
    """Each case's thinker prompt, through our preprocessing stage and encoders."""
    ref_dir = Path(manifest["ref_dir"])
    stage = create_preprocessing(str(ckpt))
    image = ImageEncoder(parts["image_encoder"], "cpu")
    audio = AudioEncoder(parts["audio_encoder"], "cpu")
    config = load_part(str(ckpt), "thinker", "safetensors", "float32", "cpu")[1]
    prompts = {}
    for name in CASES:
        data = _request(manifest["by_name"][name], ref_dir)
        pre = anyio.run(stage.run, SimpleNamespace(request_id=name, data=data, params={}))
        assert pre["sampling"]["repetition_penalty"] == 1.0
        encoders = {}
        if pre["images"]:
            encoders["image_encoder"] = image._encode(pre["images"])
        if pre["audios"]:
            encoders["audio_encoder"] = audio._encode(pre["audios"])
        prompts[name] = to_prompt(assemble(pre, encoders, config))
    return prompts


def _speak_in_process(
    ckpt: Path, manifest: dict, parts: dict[str, Any], prompts: dict, names: list[str] = CASES
) -> dict:
    """All cases (``names``) on one thinker engine, then on one talker engine: tokens, frames."""
    config = load_part(str(ckpt), "thinker", "safetensors", "float32", "cpu")[1]
    talker_cfg = TalkerConfig.from_dict(read_raw_config(ckpt))
    lm = parts["thinker"]
    thinker = ThinkerStepModel(
        lm,
        config.text,
        eos_ids=set(ChatPrompter.from_dir(ckpt).eos_token_ids),
        device=torch.device("cpu"),
        dtype=torch.float32,
    )
    with torch.no_grad():
        tts_rows = lm.embed(torch.tensor(talker_cfg.tts_special_ids)).float()
    talker = TalkerStepModel(parts["talker_ar"], talker_cfg, device="cpu", dtype=torch.float32)
    settings = EngineSettings(
        max_running_requests=4, max_total_tokens=4096, max_prefill_tokens=4096
    )
    tokens: dict[str, list[int]] = {name: [] for name in names}
    frames: dict[str, list[torch.Tensor]] = {name: [] for name in names}
    talker_prompts: dict[str, TalkerPrompt] = {}

    async def think(engine: Any, name: str) -> None:
        prompt = prompts[name]
        talker_prompt = TalkerPrompt(talker_cfg, manifest["by_name"][name]["speaker"])
        thinker.capture(name, talker_cfg.accept_hidden_layer)
        sampling = SamplingParams(temperature=0.0, max_new_tokens=THINKER_TOKENS)
        async with engine.enqueue(name, prompt, sampling) as stream:
            async for out in stream:
                layer0, accept = out["rows"]
                if not tokens[name]:
                    talker_prompt.add_prompt(
                        prompt.token_ids,
                        layer0,
                        accept,
                        tts_embeddings=tts_rows,
                        positions=prompt.positions,
                    )
                else:  # the rows of the token before this one
                    talker_prompt.add_token(tokens[name][-1], layer0[0], accept[0])
                tokens[name].append(int(out["token"]))
        thinker.release(name)
        talker_prompt.finish()
        talker_prompts[name] = talker_prompt

    async def speak(engine: Any, name: str) -> None:
        greedy = {**TALKER_SAMPLING, "temperature": 0.0}
        sampling = SamplingParams(**greedy, max_new_tokens=FRAMES)
        async with engine.enqueue(name, talker_prompts[name], sampling) as stream:
            async for frame in stream:
                if frame is not None:
                    frames[name].append(frame)

    async def main() -> None:
        for model, run in ((thinker, think), (talker, speak)):
            engine = create_engine(model, settings, device="cpu")
            try:
                with anyio.fail_after(300):
                    async with anyio.create_task_group() as tg:
                        for name in names:
                            tg.start_soon(run, engine, name)
            finally:
                await engine.aclose()

    anyio.run(main)
    return {"tokens": tokens, "frames": frames}


def test_thinker_tokens_and_talker_codes_equal_the_reference(reference):
    ckpt, manifest = reference
    torch.set_num_threads(1)
    parts = _parts(ckpt)
    got = _speak_in_process(ckpt, manifest, parts, _prompts(ckpt, manifest, parts))
    problems, errors = [], {}
    for name in CASES:
        case, ref = manifest["by_name"][name], _tensors(manifest, name)
        problem = _token_mismatch(name, got["tokens"][name], case, ref)
        problem = problem or _frame_mismatch(name, got["frames"][name], ref)
        if problem:
            problems.append(problem)
            continue
        codes = torch.stack(got["frames"][name]).t()[None]  # [1, G, F]
        wav = parts["code2wav"].decode(codes)[0, 0]
        errors[name] = rel_l2(wav, ref["wav"])
    print(
        "code2wav.decode of our frames, rel L2 "
        + ", ".join(f"{k} {v:.1e}" for k, v in errors.items())
    )
    assert not problems, "\n".join(problems)
    assert max(errors.values()) <= REL_L2, errors
