"""The thinker's text decoder, sparse experts and prompt position ids (tiny sizes, CPU)."""

from __future__ import annotations

import dataclasses

import pytest

torch = pytest.importorskip("torch")

import torch.nn.functional as F  # noqa: E402

from omni_core.engine.interface import CacheLayout  # noqa: E402
from omni_core.engine.kv_cache import SlotKVCache  # noqa: E402
from omni_qwen3_omni.config import TextConfig  # noqa: E402
from omni_qwen3_omni.thinker.decoder import ThinkerLM, add_at, flat_positions  # noqa: E402
from omni_qwen3_omni.thinker.moe import SparseMoE  # noqa: E402
from omni_qwen3_omni.thinker.positions import (  # noqa: E402
    MediaTokens,
    PromptLayoutError,
    audio_token_count,
    decode_positions,
    prompt_positions,
)
from omni_qwen3_tts.layers import SwiGLU, causal_mask  # noqa: E402
from omni_qwen3_tts.talker import SlotStore  # noqa: E402

torch.set_num_threads(1)

TINY = TextConfig(
    vocab_size=97,
    hidden_size=32,
    intermediate_size=24,
    num_hidden_layers=3,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=8,
    mrope_section=(1, 2, 1),
    rope_theta=10000.0,
    moe_intermediate_size=16,
    num_experts=6,
    num_experts_per_tok=2,
    mlp_only_layers=(1,),
)
TOK = MediaTokens(
    audio=90, image=91, video=92, audio_start=93, vision_start=94, position_id_per_seconds=13
)
V_END, A_END = 95, 96


def _randomise(module: torch.nn.Module, seed: int = 0) -> None:
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in module.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(1 + 0.1 * torch.randn(p.shape, generator=gen))
            elif name.endswith("mlp.gate.weight"):
                p.copy_(0.5 * torch.randn(p.shape, generator=gen))
            else:
                p.copy_(0.1 * torch.randn(p.shape, generator=gen))


def _model(cfg: TextConfig = TINY, seed: int = 0) -> ThinkerLM:
    lm = ThinkerLM(cfg).eval()
    _randomise(lm, seed)
    return lm


def _positions(batch: int, steps: int, seed: int = 3) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(0, 50, (3, batch, steps), generator=gen)


# -- sparse experts ---------------------------------------------------------------------------


def _naive_moe(moe: SparseMoE, x: torch.Tensor) -> torch.Tensor:
    """Token by token: softmax, top-k, (renormalise), weighted sum of the chosen experts."""
    flat = x.reshape(-1, x.shape[-1])
    out = torch.zeros_like(flat)
    for n in range(flat.shape[0]):
        probs = torch.softmax(moe.gate(flat[n]).float(), dim=-1)
        top = sorted(range(moe.num_experts), key=lambda e: -float(probs[e]))[: moe.top_k]
        weights = probs[top]
        if moe.norm_topk_prob:
            weights = weights / weights.sum()
        for w, e in zip(weights, top, strict=True):
            out[n] += w.to(x.dtype) * moe.experts[e](flat[n])
    return out.view(x.shape)


@pytest.mark.parametrize("norm", [True, False])
@pytest.mark.parametrize("shape", [(1, 1), (2, 5), (3, 7)])
def test_moe_grouped_by_expert_equals_per_token(norm, shape):
    moe = SparseMoE(16, 12, num_experts=7, top_k=3, norm_topk_prob=norm).eval()
    _randomise(moe, seed=sum(shape))
    x = torch.randn(*shape, 16, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        torch.testing.assert_close(moe(x), _naive_moe(moe, x), rtol=1e-5, atol=1e-6)


def test_moe_routing_renormalises_top_k():
    moe = SparseMoE(16, 12, num_experts=7, top_k=3, norm_topk_prob=True)
    _randomise(moe)
    x = torch.randn(9, 16, generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        weights, experts = moe.route(x)
        probs = torch.softmax(moe.gate(x).float(), dim=-1)
    torch.testing.assert_close(weights.sum(-1), torch.ones(9))
    # the chosen experts are the k most probable, in probability order
    assert torch.equal(experts, probs.topk(3, dim=-1).indices)
    picked = probs.gather(1, experts)
    torch.testing.assert_close(weights, picked / picked.sum(-1, keepdim=True))
    moe.norm_topk_prob = False
    with torch.no_grad():
        raw, _ = moe.route(x)
    torch.testing.assert_close(raw, picked)
    assert bool((raw.sum(-1) < 1).all())


def test_moe_single_expert_rows_get_that_expert_only():
    moe = SparseMoE(8, 4, num_experts=3, top_k=1)
    _randomise(moe)
    x = torch.randn(5, 8, generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        _, experts = moe.route(x)
        out = moe(x)
        for n in range(5):
            torch.testing.assert_close(out[n], moe.experts[int(experts[n, 0])](x[n]))


# -- decoder -----------------------------------------------------------------------------------


def test_state_dict_names_follow_the_release():
    keys = set(_model().state_dict())
    for key in (
        "model.embed_tokens.weight",
        "model.norm.weight",
        "lm_head.weight",
        "model.layers.0.input_layernorm.weight",
        "model.layers.0.post_attention_layernorm.weight",
        "model.layers.0.self_attn.q_proj.weight",
        "model.layers.0.self_attn.k_proj.weight",
        "model.layers.0.self_attn.v_proj.weight",
        "model.layers.0.self_attn.o_proj.weight",
        "model.layers.0.self_attn.q_norm.weight",
        "model.layers.0.self_attn.k_norm.weight",
        "model.layers.0.mlp.gate.weight",
        "model.layers.0.mlp.experts.5.gate_proj.weight",
        "model.layers.0.mlp.experts.5.up_proj.weight",
        "model.layers.0.mlp.experts.5.down_proj.weight",
        "model.layers.1.mlp.gate_proj.weight",  # mlp_only_layers: dense
        "model.layers.2.mlp.experts.0.down_proj.weight",
    ):
        assert key in keys, key
    assert not any(k.startswith("model.layers.1.mlp.experts") for k in keys)
    assert not any("inv_freq" in k or "bias" in k for k in keys)
    lm = _model()
    assert isinstance(lm.model.layers[1].mlp, SwiGLU)
    assert lm.model.layers[1].mlp.gate_proj.out_features == TINY.intermediate_size


def test_tied_embeddings_share_the_matrix():
    lm = ThinkerLM(dataclasses.replace(TINY, tie_word_embeddings=True))
    assert lm.lm_head.weight is lm.model.embed_tokens.weight


class ListStore:
    """The simplest KV store: append each call's keys/values, return everything so far."""

    def __init__(self):
        self.k: dict[int, torch.Tensor] = {}
        self.v: dict[int, torch.Tensor] = {}

    def update(self, layer, k, v):
        if layer in self.k:
            k = torch.cat([self.k[layer], k], dim=2)
            v = torch.cat([self.v[layer], v], dim=2)
        self.k[layer], self.v[layer] = k, v
        return k, v


def test_token_by_token_decoding_equals_full_forward():
    lm = _model()
    batch, steps = 2, 9
    x = torch.randn(batch, steps, TINY.hidden_size, generator=torch.Generator().manual_seed(4))
    pos = _positions(batch, steps)
    with torch.no_grad():
        full = lm(x, pos)
        store, pieces, prefill = ListStore(), [], 4
        mask = torch.ones(prefill, prefill, dtype=torch.bool).tril()[None, None]
        pieces.append(
            lm(x[:, :prefill], pos[:, :, :prefill], mask.expand(batch, -1, -1, -1), store)
        )
        for t in range(prefill, steps):
            pieces.append(lm(x[:, t : t + 1], pos[:, :, t : t + 1], None, store))
    torch.testing.assert_close(torch.cat(pieces, dim=1), full, rtol=1e-5, atol=1e-5)


def test_slot_cache_batch_of_different_lengths_equals_separate_runs():
    """Through the engine's slot cache: rows at different offsets, right-padded, step together."""
    lm = _model(seed=1)
    gen = torch.Generator().manual_seed(5)
    lengths = [6, 3]
    xs = [torch.randn(1, n + 2, TINY.hidden_size, generator=gen) for n in lengths]
    ps = [_positions(1, n + 2, seed=7 + i) for i, n in enumerate(lengths)]
    with torch.no_grad():
        alone = [lm(x, p)[0] for x, p in zip(xs, ps, strict=True)]
        t = TINY
        layout = CacheLayout(
            t.num_hidden_layers, t.num_key_value_heads, t.head_dim, torch.float32, "cpu"
        )
        cache = SlotKVCache(layout, num_slots=2, slot_len=16)
        slots = [cache.allocate(), cache.allocate()]
        # prefill both prompts in one padded batch
        steps = max(lengths)
        x = torch.zeros(2, steps, TINY.hidden_size)
        pos = torch.zeros(3, 2, steps, dtype=torch.long)
        for row, n in enumerate(lengths):
            x[row, :n], pos[:, row, :n] = xs[row][0, :n], ps[row][:, 0, :n]
        starts = torch.tensor([0, 0])
        mask = causal_mask(starts, torch.tensor(lengths), steps, steps)
        out = lm(x, pos, mask, SlotStore(cache, slots, [0, 0], steps))
        for row, n in enumerate(lengths):
            torch.testing.assert_close(out[row, :n], alone[row][:n], rtol=1e-5, atol=1e-5)
        # two decode steps, each row at its own offset
        cached = list(lengths)
        for _ in range(2):
            x1 = torch.stack([xs[r][0, cached[r]] for r in range(2)])[:, None]
            p1 = torch.stack([ps[r][:, 0, cached[r]] for r in range(2)], dim=1)[:, :, None]
            total = max(cached) + 1
            mask = causal_mask(torch.tensor(cached), torch.ones(2, dtype=torch.long), 1, total)
            out = lm(x1, p1, mask, SlotStore(cache, slots, cached, total))
            for row in range(2):
                torch.testing.assert_close(
                    out[row, 0], alone[row][cached[row]], rtol=1e-5, atol=1e-5
                )
            cached = [c + 1 for c in cached]


def test_store_with_several_tokens_needs_a_mask():
    lm = _model()
    x = torch.randn(1, 3, TINY.hidden_size)
    with pytest.raises(ValueError, match="explicit mask"):
        lm(x, _positions(1, 3), None, ListStore())


def test_deepstack_adds_features_only_at_visual_positions_after_early_layers():
    lm = _model(seed=2)
    batch, steps, hidden = 2, 7, TINY.hidden_size
    gen = torch.Generator().manual_seed(6)
    x = torch.randn(batch, steps, hidden, generator=gen)
    pos = _positions(batch, steps)
    visual = torch.zeros(batch, steps, dtype=torch.bool)
    visual[0, 2:4] = True
    visual[1, 5] = True
    index = flat_positions(visual)
    assert index.tolist() == [2, 3, 12]
    feats = [torch.randn(3, hidden, generator=gen) for _ in range(2)]
    everything = set(range(TINY.num_hidden_layers + 1))
    with torch.no_grad():
        plain, plain_cap = lm(x, pos, capture_layers=everything)
        out, cap = lm(x, pos, deepstack=[(index, f) for f in feats], capture_layers=everything)
        # after layer 0: exactly the features at the visual positions, nothing elsewhere
        delta = (cap[1] - plain_cap[1]).reshape(batch * steps, hidden)
        torch.testing.assert_close(delta[index], feats[0], rtol=0, atol=1e-6)
        others = torch.ones(batch * steps, dtype=torch.bool)
        others[index] = False
        assert torch.equal(delta[others], torch.zeros_like(delta[others]))
        # after layer 1: layer 1's own addition on top of what layer 1 made of the changed input
        redo = lm.model.layers[1](cap[1], *lm.model.rotary(pos, x.dtype), _causal(steps), None)
        torch.testing.assert_close(cap[2], add_at(redo, index, feats[1]), rtol=1e-6, atol=1e-6)
        # layer 2 (no third set): no addition, and the returned state is the normed capture
        redo = lm.model.layers[2](cap[2], *lm.model.rotary(pos, x.dtype), _causal(steps), None)
        torch.testing.assert_close(out, lm.model.norm(redo), rtol=1e-6, atol=1e-6)
    assert torch.equal(cap[0], x) and torch.equal(cap[3], out)
    assert not torch.allclose(out, plain)


def _causal(steps: int) -> torch.Tensor:
    return torch.ones(steps, steps, dtype=torch.bool).tril()


def test_deepstack_feature_count_must_match_positions():
    with pytest.raises(ValueError, match="deepstack features"):
        add_at(torch.zeros(1, 4, 8), torch.tensor([1, 2]), torch.zeros(3, 8))


def test_equal_streams_reduce_to_plain_rope():
    lm = _model()
    pos = torch.arange(6)[None]
    cos3, sin3 = lm.model.rotary(pos[None].expand(3, 1, 6), torch.float32)
    freqs = pos[..., None].float() * lm.model.inv_freq
    emb = torch.cat([freqs, freqs], dim=-1)
    torch.testing.assert_close(cos3, emb.cos())
    torch.testing.assert_close(sin3, emb.sin())


def test_logits_and_embed():
    lm = _model()
    ids = torch.tensor([[1, 5, 7]])
    x = lm.embed(ids)
    assert x.shape == (1, 3, TINY.hidden_size)
    with torch.no_grad():
        logits = lm.logits(lm(x, torch.arange(3)[None]))
    assert logits.shape == (1, 3, TINY.vocab_size)
    torch.testing.assert_close(logits, F.linear(lm(x, torch.arange(3)[None]), lm.lm_head.weight))


# -- positions ---------------------------------------------------------------------------------


def _image(grid) -> list[int]:
    t, h, w = grid
    return [TOK.vision_start] + [TOK.image] * (t * h * w // 4) + [V_END]


def _audio(n: int) -> list[int]:
    return [TOK.audio_start] + [TOK.audio] * n + [A_END]


def test_text_positions_count_up():
    r = prompt_positions([5, 6, 7, 8], TOK)
    assert r.positions.tolist() == [[0, 1, 2, 3]] * 3
    assert r.next_position == 4 and r.rope_delta == 0
    assert decode_positions(r.next_position, 2).tolist() == [[4, 5]] * 3
    assert decode_positions(4, 2, offset=3).tolist() == [[7, 8]] * 3


def test_image_positions_are_a_grid_then_text_resumes_past_it():
    ids = [1, 2, *_image((1, 4, 6)), 3]
    r = prompt_positions(ids, TOK, image_grids=[(1, 4, 6)])
    t, h, w = r.positions.tolist()
    # text 0,1; vision_start 2; 2x3 grid from 3; vision_end at 3 + max(1, 2) + 1 = 6
    assert t == [0, 1, 2] + [3] * 6 + [6, 7]
    assert h == [0, 1, 2, 3, 3, 3, 4, 4, 4, 6, 7]
    assert w == [0, 1, 2, 3, 4, 5, 3, 4, 5, 6, 7]
    assert r.next_position == 8 and r.rope_delta == 8 - len(ids)


def test_audio_positions_are_sequential():
    ids = [1, *_audio(5), 2]
    r = prompt_positions(ids, TOK, audio_lengths=[5])
    assert r.positions.tolist() == [list(range(len(ids)))] * 3
    assert r.rope_delta == 0


def test_two_images_and_audio():
    ids = [1, *_image((1, 2, 4)), *_audio(3), *_image((1, 4, 2)), 2]
    r = prompt_positions(ids, TOK, image_grids=[(1, 2, 4), (1, 4, 2)], audio_lengths=[3])
    t, h, w = r.positions.tolist()
    assert w[2:4] == [2, 3] and h[2:4] == [2, 2]  # first image: 1x2
    assert t[4:11] == [4, 5, 6, 7, 8, 9, 10]  # vision_end, audio block: sequential
    assert h[11:13] == [11, 12] and w[11:13] == [11, 11]  # second image: 2x1
    assert r.next_position == 15 and r.rope_delta == 0


def test_video_temporal_positions_count_seconds():
    ids = [TOK.vision_start] + [TOK.video] * 8 + [V_END]
    r = prompt_positions(ids, TOK, video_grids=[(2, 4, 4)], video_seconds_per_grid=[2.0])
    t = r.positions[0].tolist()
    assert t[1:5] == [1] * 4 and t[5:9] == [27] * 4  # 2 s per step x 13 per second
    assert t[9] == 28 and r.next_position == 29


def test_video_with_audio_interleaves_by_time():
    # one frame-row per 13 audio tokens: video t=0, audio 0..12, video t=13, audio 13..15
    grid, n_audio = (2, 2, 2), 16
    block = [TOK.video] + [TOK.audio] * 13 + [TOK.video] + [TOK.audio] * 3
    ids = [7, TOK.vision_start, TOK.audio_start, *block, A_END, V_END]
    r = prompt_positions(
        ids, TOK, video_grids=[grid], video_seconds_per_grid=[1.0], audio_lengths=[n_audio]
    )
    t = r.positions[0].tolist()
    assert t[3] == 3 and t[4:17] == list(range(3, 16)) and t[17] == 16
    assert t[18:21] == [16, 17, 18] and t[21] == 19
    with pytest.raises(PromptLayoutError, match="time order"):
        swapped = [TOK.audio, TOK.video, *block[2:]]
        prompt_positions(
            [7, TOK.vision_start, TOK.audio_start, *swapped, A_END, V_END],
            TOK,
            video_grids=[grid],
            video_seconds_per_grid=[1.0],
        )


@pytest.mark.parametrize(
    ("kwargs", "ids", "match"),
    [
        ({}, _image((1, 2, 2)), "no image grid"),
        ({"image_grids": [(1, 2, 2), (1, 2, 2)]}, _image((1, 2, 2)), "2 image grids"),
        ({"image_grids": [(1, 4, 4)]}, _image((1, 2, 2)), "needs 4 placeholders"),
        ({"audio_lengths": [4]}, _audio(3), "do not match"),
        ({}, [1, TOK.image, 2], "outside"),
        (
            {"video_grids": [(2, 2, 2)], "video_seconds_per_grid": [0.3]},
            [TOK.vision_start] + [TOK.video] * 2,
            "fractional",
        ),
        ({"video_grids": [(2, 2, 2)]}, [1], "video_seconds_per_grid"),
    ],
)
def test_inconsistent_prompts_are_refused(kwargs, ids, match):
    with pytest.raises(PromptLayoutError, match=match):
        prompt_positions(ids, TOK, **kwargs)


def test_audio_token_count_follows_the_release_formula():
    assert [audio_token_count(m) for m in (30, 99, 100, 130, 250, 400)] == [4, 13, 13, 17, 33, 52]


def test_a_compiled_static_step_traces_one_layer_per_kind_of_layer():
    """``engine.enable_torch_compile``: the sparse layers (0 and 2) call one traced layer
    (omni_core.engine.layer_regions); the dense one (1), a body used once, dynamo
    inlines into the step. The step computes what eager does; each layer writes its keys."""
    from omni_core.engine.static_kv import StaticSlotStore, static_mask

    lm = _model()
    graphs: list[torch.fx.GraphModule] = []

    def record(graph, example):
        graphs.append(graph)
        return graph.forward

    def step(caches):
        def run(x, positions, cache_pos, slots):
            store = StaticSlotStore(*caches, slots, cache_pos, 16, regions=True)
            return lm(x, positions, static_mask(cache_pos, 16), store)

        return run

    caches = [torch.zeros(3, 3, 2, 16, 8) for _ in range(4)]
    x = torch.randn(2, 1, 32)
    cache_pos, slots = torch.tensor([[2], [6]]), torch.tensor([0, 1])
    positions = cache_pos[None].expand(3, -1, -1).contiguous()
    torch._dynamo.reset()
    with torch.inference_mode():
        compiled = torch.compile(step(caches[:2]), backend=record, fullgraph=True)
        got = compiled(x, positions, cache_pos, slots)
        want = step(caches[2:])(x, positions, cache_pos, slots)
    invoke = torch.ops.higher_order.invoke_subgraph
    bodies = [n.args[0].target for n in graphs[0].graph.nodes if n.target is invoke]
    assert bodies == ["subgraph_0", "subgraph_0"]
    assert "topk" in graphs[0].subgraph_0.code  # the sparse layer's router
    assert "silu" in graphs[0].code and "topk" not in graphs[0].code  # the dense one, inline
    # close, not equal: a traced mixture may take the stacked experts where eager loops
    torch.testing.assert_close(got, want)
    torch.testing.assert_close(caches[0], caches[2])
    torch.testing.assert_close(caches[1], caches[3])
    assert caches[0].abs().sum(dim=(1, 2, 3, 4)).gt(0).all()
