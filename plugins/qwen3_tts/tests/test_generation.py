"""Frame generation through the StepModel API: batching, sampling rules, stopping."""

from __future__ import annotations

import copy

import pytest

torch = pytest.importorskip("torch")

from omni_core.engine.interface import SamplingParams, Sequence  # noqa: E402
from omni_core.engine.kv_cache import SlotKVCache  # noqa: E402
from omni_qwen3_tts.layers import inv_frequencies, mrope_cos_sin, rope_cos_sin  # noqa: E402
from omni_qwen3_tts.sampling import RowSampling, select_tokens  # noqa: E402

TEXTS = ["Hello", "Hello the world, again and again", "he", "the user is an assistant"]


def _prompts(model):
    speakers = ["serena", "ryan", "eric", "serena"]
    modes = [True, False, False, True]
    return [
        model.prompts.custom_voice(t, s, "english", non_streaming=m)
        for t, s, m in zip(TEXTS, speakers, modes, strict=True)
    ]


def _run_batched(model, prompts, params, join_late: int | None = None) -> list[torch.Tensor]:
    """Drive the StepModel like an engine: one cache, finished sequences leave the batch."""
    cache = SlotKVCache(model.cache_layout(), num_slots=len(prompts), slot_len=256)
    seqs = []
    for i, (prompt, p) in enumerate(zip(prompts, params, strict=True)):
        seq = Sequence(request_id=str(i), prompt=prompt, sampling=p)
        seq.slot = cache.allocate()
        if p.seed is not None:
            seq.generator = torch.Generator().manual_seed(p.seed)
        seqs.append(seq)
    frames: dict[str, list[torch.Tensor]] = {s.request_id: [] for s in seqs}
    waiting = seqs[join_late:] if join_late is not None else []
    running = seqs[:join_late] if join_late is not None else list(seqs)

    def record(batch, results):
        for seq, result in zip(batch, results, strict=True):
            if result.output is not None:
                frames[seq.request_id].append(result.output)
            seq.finished = result.finished

    record(running, model.prefill(running, cache))
    steps = 0
    while True:
        running = [s for s in running if not s.finished]
        if waiting and steps == 2:  # continuous batching: late joiners prefill between steps
            record(waiting, model.prefill(waiting, cache))
            running += [s for s in waiting if not s.finished]
            waiting = []
        if not running and not waiting:
            break
        if running:
            record(running, model.decode(running, cache))
        steps += 1
    return [torch.stack(frames[s.request_id]) for s in seqs]


@pytest.mark.parametrize("sampled", [False, True])
def test_batched_equals_sequential(tiny_model, sampled):
    prompts = _prompts(tiny_model)
    if sampled:
        params = [
            SamplingParams(
                temperature=0.9,
                top_k=50,
                top_p=0.9,
                repetition_penalty=1.05,
                seed=10 + i,
                max_new_tokens=12,
            )
            for i in range(len(prompts))
        ]
    else:
        params = [
            SamplingParams(temperature=0.0, repetition_penalty=1.05, max_new_tokens=6 + i)
            for i in range(len(prompts))
        ]
    batched = _run_batched(tiny_model, prompts, copy.deepcopy(params))
    late = _run_batched(tiny_model, prompts, copy.deepcopy(params), join_late=2)
    for prompt, p, got, got_late in zip(prompts, params, batched, late, strict=True):
        alone = tiny_model.generate(
            prompt,
            max_new_tokens=p.max_new_tokens,
            temperature=p.temperature,
            top_k=p.top_k,
            top_p=p.top_p,
            repetition_penalty=p.repetition_penalty,
            seed=p.seed,
        )
        assert torch.equal(got, alone)
        assert torch.equal(got_late, alone)
        assert got.dtype == torch.long and got.shape[1] == 16


def test_codes_stay_in_the_codebooks(tiny_model):
    prompt = _prompts(tiny_model)[1]
    codes = tiny_model.generate(prompt, max_new_tokens=10, temperature=1.0, top_k=0, seed=1)
    assert codes.shape == (10, 16)
    assert int(codes.min()) >= 0 and int(codes.max()) < 64  # control ids are suppressed


def test_eos_is_banned_for_two_frames_then_stops(tiny_model):
    """With a head that always prefers EOS, the release still emits two frames, then stops."""
    model = copy.copy(tiny_model)
    talker = copy.deepcopy(tiny_model.talker)
    eos = tiny_model.config.talker.codec_eos_token_id
    with torch.no_grad():
        talker.codec_head.weight[eos] = talker.model.norm.weight * 1000
    model.talker = talker
    codes = model.generate(_prompts(tiny_model)[0], max_new_tokens=20)
    assert codes.shape == (2, 16)


def test_step_outputs_are_separate_int64_frames_and_banned_ids_are_built_once(tiny_model):
    prompts = _prompts(tiny_model)[:3]
    cache = SlotKVCache(tiny_model.cache_layout(), len(prompts), 256)
    seqs = []
    for i, prompt in enumerate(prompts):
        seq = Sequence(request_id=str(i), prompt=prompt, sampling=SamplingParams(temperature=0))
        seq.slot = cache.allocate()
        seqs.append(seq)
    for step in (tiny_model.prefill, tiny_model.decode):
        results = step(seqs, cache)
        outputs = [r.output for r in results]
        for seq, frame in zip(seqs, outputs, strict=True):
            assert frame.dtype == torch.long and frame.shape == (16,)
            assert frame.device.type == "cpu"
            assert seq.state["last_codes"] is frame
            assert seq.state["history"][-1] == int(frame[0])
        assert len({tuple(f.tolist()) for f in outputs}) > 1  # each row its own frame

    suppressed, with_eos = tiny_model._banned_ids()
    again = tiny_model._banned_ids()
    assert again[0] is suppressed and again[1] is with_eos  # cached, not rebuilt per step
    eos = tiny_model.config.talker.codec_eos_token_id
    assert torch.equal(suppressed, tiny_model.talker.suppressed_ids(tiny_model.device))
    assert torch.equal(with_eos, torch.cat([suppressed, torch.tensor([eos])]))


def test_prefill_reports_its_length(tiny_model):
    prompt = _prompts(tiny_model)[1]
    cache = SlotKVCache(tiny_model.cache_layout(), 1, 64)
    seq = Sequence(request_id="a", prompt=prompt, sampling=SamplingParams(temperature=0))
    seq.slot = cache.allocate()
    tiny_model.prefill([seq], cache)
    assert seq.cached == tiny_model.prompt_length(prompt)
    tiny_model.decode([seq], cache)
    assert seq.cached == tiny_model.prompt_length(prompt) + 1


def test_repetition_penalty_and_top_k():
    logits = torch.tensor([[2.0, 1.9, -1.0, 0.5]])
    history = [torch.tensor([0])]
    greedy = RowSampling(greedy=True, repetition_penalty=1.2)
    # 2.0 / 1.2 < 1.9: the penalised token loses.
    assert int(select_tokens(logits, [greedy], [None], history)) == 1
    assert int(select_tokens(logits, [RowSampling(greedy=True)], [None], history)) == 0
    banned = [torch.tensor([0, 1])]
    assert int(select_tokens(logits, [greedy], [None], history, banned)) == 3
    top1 = RowSampling(temperature=5.0, top_k=1)
    gens = [torch.Generator().manual_seed(0)]
    assert all(int(select_tokens(logits, [top1], gens)) == 0 for _ in range(10))


def test_mrope_with_equal_streams_is_plain_rope():
    inv = inv_frequencies(16, 1e6)
    pos = torch.arange(7)[None]
    plain = rope_cos_sin(pos, inv, torch.float32)
    for interleaved in (True, False):
        multi = mrope_cos_sin(
            pos[None].expand(3, -1, -1), inv, (4, 2, 2), interleaved, torch.float32
        )
        torch.testing.assert_close(multi[0], plain[0])
        torch.testing.assert_close(multi[1], plain[1])
    # Distinct streams: interleaved index 1 takes the height stream, index 0 the temporal one.
    streams = torch.stack([pos, pos * 0 + 100, pos * 0 + 200])
    cos, _ = mrope_cos_sin(streams, inv, (4, 2, 2), True, torch.float32)
    assert torch.allclose(cos[0, :, 1], torch.cos(100 * inv[1]).expand(7))
    assert torch.allclose(cos[0, :, 2], torch.cos(200 * inv[2]).expand(7))
    assert torch.allclose(cos[0, :, 0], torch.cos(pos[0] * inv[0]))


def test_the_cpu_engine_stage_packs_large_linear_weights_and_frames_do_not_change(tmp_path):
    """factory.pack_weights (default on the CPU): oneDNN-packed talker, the same frames."""
    import json
    import shutil

    from omni_core.engine.cpu_linear import PackedLinear, packing_available
    from omni_qwen3_tts.model import Qwen3TTSModel
    from omni_qwen3_tts.stages import create_tts_engine
    from omni_qwen3_tts.weights import PRESETS_DIR

    if not packing_available():
        pytest.skip("torch built without oneDNN")
    root = tmp_path / "wide"
    shutil.copytree(PRESETS_DIR / "tiny", root)
    config = json.loads((root / "config.json").read_text())
    config["talker_config"]["intermediate_size"] = 1 << 15  # MLP weights of 1M elements
    (root / "config.json").write_text(json.dumps(config))

    dense = Qwen3TTSModel.from_pretrained(root, load_format="dummy", seed=3)
    packed = create_tts_engine(str(root), load_format="dummy", seed=3).model
    mlp = packed.talker.model.layers[0].mlp
    assert isinstance(mlp.gate_proj, PackedLinear) and isinstance(mlp.down_proj, PackedLinear)
    assert type(packed.talker.model.layers[0].self_attn.q_proj) is torch.nn.Linear  # small
    for prompt in _prompts(dense)[:2]:
        assert torch.equal(packed.generate(prompt, 8), dense.generate(prompt, 8))

    kept = create_tts_engine(str(root), load_format="dummy", seed=4, pack_weights=False).model
    assert type(kept.talker.model.layers[0].mlp.gate_proj) is torch.nn.Linear


def _engine_frames(model, prompts, params, settings, static=None):
    """Each prompt's frames through the engine, all submitted together."""
    import anyio

    from omni_core.engine.torch_engine import TorchEngine

    async def main():
        out = {}
        async with TorchEngine(model, settings, static=static) as engine:

            async def one(i, prompt):
                frames = [f async for f in engine.enqueue(str(i), prompt, copy.copy(params[i]))]
                out[i] = torch.stack([f for f in frames if f is not None])

            async with anyio.create_task_group() as group:
                for i, prompt in enumerate(prompts):
                    group.start_soon(one, i, prompt)
        return [out[i] for i in range(len(prompts))]

    return anyio.run(main)


def _fresh_tiny():
    from omni_qwen3_tts.model import Qwen3TTSModel

    # its own model: the static steps stay on the model (and its code predictor)
    return Qwen3TTSModel.from_pretrained("tiny", load_format="dummy", seed=0)


@pytest.mark.parametrize("sampled", [False, True])
def test_static_shape_decode_steps_equal_eager(tiny_model, sampled):
    """Talker and code predictor through the static step (3 rows padded to 4) = eager frames."""
    from omni_core.engine.buckets import StaticPlan
    from omni_core.engine.interface import EngineSettings

    prompts = _prompts(tiny_model)[:3]
    params = [
        SamplingParams(
            temperature=0.9 if sampled else 0.0, top_k=50, seed=40 + i, max_new_tokens=10
        )
        for i in range(len(prompts))
    ]
    settings = EngineSettings(max_running_requests=4, max_total_tokens=1024)
    eager = _engine_frames(tiny_model, prompts, params, settings)
    model = _fresh_tiny()
    static = _engine_frames(model, prompts, params, settings, StaticPlan(False, False, (1, 4), "t"))
    for a, b in zip(eager, static, strict=True):
        assert a.shape[0] >= 3 and torch.equal(a, b)
    assert model._static_talker.calls > 0 and model.talker.code_predictor.static.calls > 0


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore:.*torch.jit.script_method.*:DeprecationWarning")
def test_compiled_decode_steps_equal_eager(tiny_model):
    """engine.enable_torch_compile: inductor on the CPU, two buckets, eager's frames (the
    code predictor's whole frame one compiled graph a bucket)."""
    from omni_core.engine.interface import EngineSettings

    prompts = _prompts(tiny_model)[:2]
    params = [SamplingParams(temperature=0.0, max_new_tokens=10) for _ in prompts]
    base = dict(max_running_requests=2, max_total_tokens=1024)
    eager = _engine_frames(tiny_model, prompts, params, EngineSettings(**base))
    model = _fresh_tiny()
    settings = EngineSettings(enable_torch_compile=True, cuda_graph_max_bs=2, **base)
    compiled = _engine_frames(model, prompts, params, settings)
    for a, b in zip(eager, compiled, strict=True):
        assert torch.equal(a, b)
    assert model._static_talker.calls > 0
    # greedy frames: each bucket's whole code-predictor frame compiled as one graph
    frames = set(model.talker.code_predictor.frame_graphs.values())
    assert len(frames) == 1 and frames.pop().calls > 0


def test_the_cpu_engine_stage_gives_blocked_bf16_weights_float16_row_copies(tmp_path, monkeypatch):
    """factory.fp16_row_weights: every blocked product of the talker holds a float16 copy,
    and frames still come, the same ones every time; float32 weights are refused."""
    import json
    import shutil

    from omni_core.engine import cpu_linear
    from omni_core.engine.cpu_kernel_choice import KernelChoice
    from omni_core.engine.cpu_row_copy import row_copies_available
    from omni_qwen3_tts.model import Qwen3TTSModel
    from omni_qwen3_tts.stages import create_tts_engine
    from omni_qwen3_tts.weights import PRESETS_DIR

    if not (cpu_linear.blocking_available() and row_copies_available()):
        pytest.skip("this torch build or CPU has no oneDNN bf16 product or no fbgemm")
    blocked = KernelChoice(0, False, 0, bf16_blocked=True, source="test")
    monkeypatch.setattr(cpu_linear, "kernel_choice", lambda onednn=True: blocked)
    monkeypatch.setattr(cpu_linear, "_routes", cpu_linear.routes())
    root = tmp_path / "wide"
    shutil.copytree(PRESETS_DIR / "tiny", root)
    config = json.loads((root / "config.json").read_text())
    config["talker_config"]["intermediate_size"] = 1 << 15  # MLP weights of 1M elements
    (root / "config.json").write_text(json.dumps(config))

    model = create_tts_engine(
        str(root), load_format="dummy", seed=3, dtype="bfloat16", fp16_row_weights=True
    ).model
    mlp = model.talker.model.layers[0].mlp
    assert isinstance(mlp.down_proj, cpu_linear.BlockedLinear)
    assert mlp.down_proj.__dict__.get("row_copy") is not None
    prompt = _prompts(Qwen3TTSModel.from_pretrained(root, load_format="dummy", seed=3))[0]
    first = model.generate(prompt, 4)
    assert first.shape == (4, 16)
    assert torch.equal(first, model.generate(prompt, 4))  # greedy: repeatable
    with pytest.raises(ValueError, match=r"fp16_row_weights = true: the copies are of bf16"):
        create_tts_engine(
            str(root), load_format="dummy", seed=3, dtype="float32", fp16_row_weights=True
        )
