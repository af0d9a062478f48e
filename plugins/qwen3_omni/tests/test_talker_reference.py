"""Parity of the talker with transformers' ``qwen3_omni_moe`` (opt-in).

Runs only when ``QWEN_TTS_REF_PYTHON`` names the reference environment's
python (transformers 4.57.3; see ``plugins/qwen3_tts/tests/REFERENCE.md``).
``reference/talker_reference.py`` builds a tiny seeded
``Qwen3OmniMoeForConditionalGeneration`` (a talker unlike our preset's), runs
``generate(..., return_audio=True, speaker=...)`` greedily (its code
predictor forced greedy) and records the thinker outputs the talker consumed
and the codes it made. We load the talker's tensors strictly through the
checkpoint loader, feed our prompt builder the same thinker rows, and need:

- the prefill rows within 1e-5 and its positions exactly;
- the same frames, code for code: at least 24 for a two-turn text prompt
  (speaker Ethan) and an image + audio prompt (Chelsie), a thinker that
  gave one token to speak (Aiden), and a talker that ends on its EOS;
- the same again when the four run batched in the engine while the thinker
  rows arrive one at a time, behind the talker.

The reference's greedy margins are recorded; a mismatch names the frame.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from reference_support import opt_in, run_reference

torch = pytest.importorskip("torch")
pytest.importorskip("safetensors")

import anyio  # noqa: E402
from safetensors.torch import load_file  # noqa: E402

from omni_core.engine.interface import EngineSettings, SamplingParams, Sequence  # noqa: E402
from omni_core.engine.kv_cache import SlotKVCache  # noqa: E402
from omni_core.engine.torch_engine import TorchEngine  # noqa: E402
from omni_qwen3_omni.checkpoint import OWNERS, Checkpoint  # noqa: E402
from omni_qwen3_omni.talker.config import TalkerConfig  # noqa: E402
from omni_qwen3_omni.talker.model import Talker  # noqa: E402
from omni_qwen3_omni.talker.prompt import TalkerPrompt  # noqa: E402
from omni_qwen3_omni.talker.step import TalkerStepModel  # noqa: E402

SCRIPT = Path(__file__).parent / "reference" / "talker_reference.py"
CASES = ["text", "image_audio", "short", "text_eos"]

pytestmark = opt_in


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("talker_ref")
    run_reference(SCRIPT.name, str(out))
    return out


@pytest.fixture(scope="module")
def loaded(reference: Path):
    torch.set_num_threads(1)
    cfg = TalkerConfig.from_dict(json.loads((reference / "config.json").read_text()))
    talker = Talker(cfg).eval().requires_grad_(False)
    count = Checkpoint.open(reference).load_into(
        talker, OWNERS["talker_ar"], "talker.", "talker (reference)"
    )
    assert count == len(talker.state_dict())
    model = TalkerStepModel(talker, cfg, device="cpu", dtype=torch.float32)
    manifest = {c["name"]: c for c in json.loads((reference / "manifest.json").read_text())}
    return cfg, talker, model, manifest


def case(reference: Path, name: str) -> dict[str, torch.Tensor]:
    return load_file(str(reference / f"{name}.safetensors"))


def prompt_of(cfg: TalkerConfig, data: dict, speaker: str, rows: int | None = None):
    """Our prompt from the recorded thinker outputs, with ``rows`` generated rows (None: all)."""
    length = data["prompt_ids"].numel()
    prompt = TalkerPrompt(cfg, speaker)
    prompt.add_prompt(
        data["prompt_ids"],
        data["thinker_embeds"][:length],
        data["thinker_accept"][:length],
        tts_embeddings=data["tts_embeds"],
        positions=data["thinker_positions"],
    )
    generated = data["thinker_embeds"][length:]
    ids = data["generated_ids"][: generated.shape[0]]
    count = generated.shape[0] if rows is None else rows
    prompt.add_tokens(ids[:count], generated[:count])
    if rows is None:
        prompt.finish()
    return prompt


def sampling(entry: dict) -> SamplingParams:
    # The reference's talker limit counts tokens; the frame of its last token is never made.
    return SamplingParams(
        temperature=0.0, repetition_penalty=1.05, max_new_tokens=entry["talker_max_new_tokens"] - 1
    )


def check_frames(name: str, ours: list, data: dict, entry: dict) -> None:
    codes = data["codes"]
    frames = [f for f in ours if f is not None]
    ended = bool(ours) and ours[-1] is None
    assert ended == (name == "text_eos"), f"{name}: EOS {'missing' if not ended else 'early'}"
    assert len(frames) == codes.shape[0] == entry["frames"], (name, len(frames), codes.shape)
    for k, frame in enumerate(frames):
        if not torch.equal(frame, codes[k]):
            raise AssertionError(
                f"{name}: frame {k} differs: ours {frame.tolist()}, reference "
                f"{codes[k].tolist()} (reference margins: codebook 0 "
                f"{float(data['code0_margins'][k]):.2e}, predictor "
                f"{float(data['predictor_margins'][k].min()):.2e})"
            )


@pytest.mark.parametrize("name", CASES)
def test_codes_match_the_reference(reference: Path, loaded, name: str):
    cfg, talker, model, manifest = loaded
    entry, data = manifest[name], case(reference, name)
    prompt = prompt_of(cfg, data, entry["speaker"])
    x, positions = prompt.prefill_inputs(talker, torch.device("cpu"), torch.float32)
    torch.testing.assert_close(x, data["talker_prefill"], atol=1e-5, rtol=0)
    length = x.shape[0]
    assert torch.equal(positions, data["talker_positions"][:, :length])
    trailing = data["talker_trailing"]
    with torch.no_grad():
        ours = talker.text_projection(
            torch.stack([prompt.text_row(k) for k in range(len(trailing))])
        )
    torch.testing.assert_close(ours, trailing, atol=1e-5, rtol=0)
    later = data["talker_positions"][:, length:]
    steps = torch.arange(later.shape[1]) + prompt.next_position
    assert torch.equal(later, steps[None].expand(3, -1))

    params = sampling(entry)
    cache = SlotKVCache(model.cache_layout(), 1, 256)
    seq = Sequence(name, prompt, params)
    seq.slot = cache.allocate()
    out = [model.prefill([seq], cache)[0]]
    while not out[-1].finished and len(out) < params.max_new_tokens:
        out.append(model.decode([seq], cache)[0])
    check_frames(name, [r.output for r in out], data, entry)
    if name in ("text", "image_audio"):
        assert entry["frames"] >= 24


@pytest.mark.anyio
async def test_engine_batch_with_the_thinker_rows_streaming_in(reference: Path, loaded):
    cfg, _, model, manifest = loaded
    data = {name: case(reference, name) for name in CASES}
    prompts = {
        name: prompt_of(cfg, data[name], manifest[name]["speaker"], rows=0) for name in CASES
    }
    settings = EngineSettings(max_running_requests=4, max_total_tokens=4 * 256, device="cpu")
    got: dict[str, list] = {name: [] for name in CASES}
    waits = []

    def ready(seq) -> bool:
        answer = TalkerStepModel.ready(model, seq)
        if not answer:
            waits.append(seq.request_id)
        return answer

    model.ready = ready  # type: ignore[method-assign]  # count the waits
    with anyio.fail_after(120):
        async with TorchEngine(model, settings) as engine:

            async def thinker(name: str) -> None:
                """Hand the rows over one by one, the first late, submitting when possible."""
                d, prompt = data[name], prompts[name]
                length = d["prompt_ids"].numel()
                rows = d["thinker_embeds"][length:]
                stream = None
                for k in range(rows.shape[0]):
                    await anyio.sleep(0.02)
                    prompt.add_token(int(d["generated_ids"][k]), rows[k])
                    if stream is None and prompt.prefill_ready:
                        stream = engine.enqueue(name, prompt, sampling(manifest[name]))
                        tg.start_soon(collect, name, stream)
                    engine.wake()
                prompt.finish()
                if stream is None:
                    tg.start_soon(
                        collect, name, engine.enqueue(name, prompt, sampling(manifest[name]))
                    )
                engine.wake()

            async def collect(name: str, stream) -> None:
                async for frame in stream:
                    got[name].append(frame)

            async with anyio.create_task_group() as tg:
                for name in CASES:
                    tg.start_soon(thinker, name)
    del model.ready
    assert waits, "the talker never had to wait for the thinker: the test lost its point"
    for name in CASES:
        # The engine delivers the EOS step's None too.
        check_frames(name, got[name], data[name], manifest[name])


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"
