"""The talkers' batched token selection: one row's choice never depends on its batch,
draws follow the filtered distribution, and nothing waits on the device."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from omni_qwen3_tts.sampling import RowSampling, select_tokens  # noqa: E402

MIXED = [
    RowSampling(greedy=True, repetition_penalty=1.2),
    RowSampling(temperature=0.9, top_k=5, top_p=0.8, repetition_penalty=1.05),
    RowSampling(temperature=1.3),
    RowSampling(temperature=0.7, top_p=0.5),
]


def _logits(rows: int, vocab: int = 64, seed: int = 0) -> torch.Tensor:
    return torch.randn(rows, vocab, generator=torch.Generator().manual_seed(seed)) * 3


def test_a_row_picks_the_same_alone_or_in_a_mixed_batch() -> None:
    logits = _logits(len(MIXED))
    histories = [torch.tensor([1, 2, 2]), torch.tensor([7]), None, torch.tensor([0])]
    banned = [torch.tensor([3]), None, torch.tensor([4, 5]), None]
    batched_gens = [torch.Generator().manual_seed(10 + b) for b in range(len(MIXED))]
    alone_gens = [torch.Generator().manual_seed(10 + b) for b in range(len(MIXED))]
    for _ in range(20):  # the generators advance alike on both sides
        together = select_tokens(logits, MIXED, batched_gens, histories, banned)
        alone = [
            int(
                select_tokens(
                    logits[b : b + 1], [row], [alone_gens[b]], [histories[b]], [banned[b]]
                )
            )
            for b, row in enumerate(MIXED)
        ]
        assert together.tolist() == alone


def test_draws_follow_the_filtered_distribution() -> None:
    logits = torch.log(torch.tensor([[0.4, 0.3, 0.2, 0.06, 0.04]]))
    gen = [torch.Generator().manual_seed(0)]
    draws = 4000

    def frequencies(row: RowSampling) -> list[float]:
        picked = [int(select_tokens(logits, [row], gen)) for _ in range(draws)]
        return [picked.count(i) / draws for i in range(5)]

    # top-k 2: 0.4 and 0.3 renormalised; top-p 0.85: the least likely whose mass stays
    # under 0.15 (0.04 and 0.06: 0.10) go; temperature 1 keeps the rest as they are
    for row, expected in [
        (RowSampling(top_k=2), [4 / 7, 3 / 7, 0, 0, 0]),
        (RowSampling(top_p=0.85), [0.4 / 0.9, 0.3 / 0.9, 0.2 / 0.9, 0, 0]),
        (RowSampling(), [0.4, 0.3, 0.2, 0.06, 0.04]),
    ]:
        got = frequencies(row)
        for g, e in zip(got, expected, strict=True):
            assert abs(g - e) < 0.03 if e else g == 0, (row, got)
    assert frequencies(RowSampling(greedy=True, temperature=5.0)) == [1, 0, 0, 0, 0]


def test_penalties_and_bans_apply_to_their_own_rows_only() -> None:
    logits = torch.tensor([[2.0, 1.9, -1.0, 0.5], [2.0, 1.9, -1.0, 0.5]])
    greedy = RowSampling(greedy=True, repetition_penalty=1.2)
    plain = RowSampling(greedy=True)
    history = [torch.tensor([0]), torch.tensor([0])]
    assert select_tokens(logits, [greedy, plain], [None, None], history).tolist() == [1, 0]
    banned = [torch.tensor([0, 1]), None]
    assert select_tokens(logits, [plain, plain], [None, None], None, banned).tolist() == [3, 0]


def test_a_step_never_reads_the_device_from_the_host() -> None:
    # On the meta device every read of a value (``.item()``, ``bool()``, ``.tolist()``, a
    # copy to the host) raises: a GPU step that did one would wait for the device.
    logits = torch.empty(len(MIXED), 50, device="meta")
    histories = [torch.tensor([1, 2]), None, torch.tensor([3]), None]
    banned = [torch.tensor([4]), torch.tensor([5, 6]), None, None]
    out = select_tokens(logits, MIXED, [None] * len(MIXED), histories, banned)
    assert out.shape == (len(MIXED),) and out.dtype == torch.long and out.device.type == "meta"


def test_a_code_predictor_frame_never_reads_the_device(tiny_model) -> None:
    # A frame's 15 picks run back to back on a GPU only if none of them reads a value
    # on the host; on the meta device any such read raises.
    import copy

    predictor = copy.deepcopy(tiny_model.talker.code_predictor).to("meta")
    width = tiny_model.config.talker.transformer.hidden_size
    rows = [RowSampling(temperature=0.9, top_k=50, top_p=0.8), RowSampling(greedy=True)]
    hidden = torch.empty(2, width, device="meta")
    seeded = [torch.Generator().manual_seed(1), None]  # a host generator: drawn, sent over
    codes = predictor.generate_frame(hidden, torch.empty(2, width, device="meta"), rows, seeded)
    assert codes.shape == (2, tiny_model.config.talker.transformer.num_code_groups - 1)


def test_widening_top_k_to_the_vocabulary_and_always_applying_top_p_picks_the_same() -> None:
    # a captured frame holds one graph for every batch's settings (draw_tokens' promise)
    from omni_qwen3_tts.sampling import draw_tokens, frame_settings

    rows = [r for r in MIXED] + [RowSampling(temperature=0.8, top_k=3), RowSampling(greedy=True)]
    settings = frame_settings(tuple(rows), len(rows) + 2, 64, torch.device("cpu"))
    assert settings.greedy.tolist()[-2:] == [True, True]  # padding rows pick greedily
    for seed in range(30):
        scores = _logits(len(rows) + 2, seed=seed)
        uniforms = torch.rand(len(rows) + 2, generator=torch.Generator().manual_seed(seed))
        own = draw_tokens(scores, settings, uniforms)
        wide = draw_tokens(scores, settings, uniforms, widest=64, nucleus=True)
        assert torch.equal(own, wide), seed


def test_a_frame_draws_its_numbers_once_per_row() -> None:
    from omni_qwen3_tts.sampling import frame_uniforms

    gens = [torch.Generator().manual_seed(3), None, torch.Generator().manual_seed(4)]
    table = frame_uniforms(gens, [True, False, True], 15, torch.device("cpu"))
    assert table.shape == (3, 15) and not table[1].any()
    assert torch.equal(table[0], torch.rand(15, generator=torch.Generator().manual_seed(3)))
    assert gens[0].initial_seed() == 3 and len(set(table[2].tolist())) == 15


@pytest.mark.parametrize(
    ("batch", "widest", "nucleus"), [(1, None, True), (3, None, True), (2, 50, False)]
)
def test_the_frame_a_cuda_graph_captures_picks_the_eager_frames_codes(
    batch, widest, nucleus
) -> None:
    # On the CPU the capturable function runs as plain code: it must equal the eager
    # frame for seeded, greedy and filtered rows padded up to the bucket.
    from omni_core.engine.buckets import StaticPlan
    from omni_core.engine.compiled import StaticContext
    from omni_qwen3_tts.model import Qwen3TTSModel
    from omni_qwen3_tts.sampling import frame_settings, frame_uniforms

    model = Qwen3TTSModel.from_pretrained("tiny", load_format="dummy", seed=0)
    predictor = model.talker.code_predictor
    width = model.config.talker.transformer.hidden_size
    # the rows the narrow frame (top-k over 50, no top-p) serves come first
    rows = [RowSampling(temperature=0.9, top_k=50), RowSampling(greedy=True)]
    rows += [RowSampling(temperature=1.1, top_p=0.7)]
    rows = rows[:batch]
    draw = torch.Generator().manual_seed(5)
    hidden, code0 = torch.randn(2, batch, width, generator=draw)
    eager = predictor.generate_frame(
        hidden, code0, rows, [torch.Generator().manual_seed(20 + b) for b in range(batch)]
    )
    predictor.prepare_static(StaticContext(StaticPlan(False, False, (4,), "t"), None), *_cpu())
    x = predictor.small_to_mtp_projection(torch.stack((hidden, code0), dim=1))
    gens = [torch.Generator().manual_seed(20 + b) for b in range(batch)]
    uniforms = frame_uniforms(gens, [r.draws for r in rows], 15, x.device)
    vocab = model.config.talker.code_predictor.vocab_size
    settings = frame_settings(tuple(rows), 4, vocab, x.device)
    pad = 4 - batch
    frame = predictor.capturable_frame(predictor.static, widest or vocab, nucleus)
    codes = frame(
        torch.nn.functional.pad(x, (0, 0, 0, 0, 0, pad)),
        settings.greedy,
        settings.temperature,
        settings.kth,
        settings.top_p,
        torch.nn.functional.pad(uniforms, (0, 0, 0, pad)),
    )
    assert codes.shape == (4, 15) and torch.equal(codes[:batch], eager)


def _cpu() -> tuple[torch.dtype, torch.device]:
    return torch.float32, torch.device("cpu")


def test_a_batch_replays_the_narrowest_frame_graph_that_holds_its_settings() -> None:
    # CUDA graphs cannot exist here: each "graph" is its capturable frame run as plain
    # code, recording which one a batch replays (what _static_frame picks and pads).
    from omni_core.engine.buckets import StaticPlan
    from omni_core.engine.compiled import StaticContext
    from omni_qwen3_tts.model import Qwen3TTSModel

    model = Qwen3TTSModel.from_pretrained("tiny", load_format="dummy", seed=0)
    predictor = model.talker.code_predictor
    vocab = model.config.talker.code_predictor.vocab_size
    usual = RowSampling(temperature=0.9, top_k=50)
    context = StaticContext(StaticPlan(False, False, (4,), "t"), None)
    predictor.prepare_static(context, *_cpu(), usual)
    assert predictor.frame_shapes == [(50, False), (vocab, True)]
    replayed: list[tuple[int, int, bool]] = []

    def stand_in(key: tuple[int, int, bool]):
        frame = predictor.capturable_frame(predictor.static, key[1], key[2])
        return lambda *inputs: (replayed.append(key), frame(*inputs))[1]

    width = model.config.talker.transformer.hidden_size
    hidden, code0 = torch.randn(2, 3, width, generator=torch.Generator().manual_seed(8))
    batches = {
        (4, 50, False): [usual, RowSampling(greedy=True), RowSampling(temperature=1.0, top_k=7)],
        (4, vocab, True): [usual, RowSampling(temperature=1.0, top_p=0.5), usual],
    }
    for key, rows in batches.items():
        predictor.frame_graphs = {}  # the per-pick static path
        want = predictor.generate_frame(hidden, code0, rows, _seeded(3))
        predictor.frame_graphs = {(4, w, n): stand_in((4, w, n)) for w, n in predictor.frame_shapes}
        replayed.clear()
        got = predictor.generate_frame(hidden, code0, rows, _seeded(3))
        assert replayed == [key] and torch.equal(got, want)


def _seeded(rows: int) -> list[torch.Generator]:
    return [torch.Generator().manual_seed(60 + b) for b in range(rows)]


@pytest.mark.slow  # inductor compiles two steps and two frames: 17 s with a warm cache
@pytest.mark.filterwarnings("ignore:.*torch.jit.script_method.*:DeprecationWarning")
def test_compiled_on_the_cpu_each_buckets_frame_is_one_graph_that_picks_the_eager_codes():
    # engine.enable_torch_compile without CUDA graphs: the usual settings' frame (greedy rows
    # too) runs as one compiled graph a bucket; a batch asking for wider sampling steps
    # through the compiled step. Both pick the codes of the eager frame. The eager frames
    # run first and outside inference mode (as a plain generate() would), so the cached
    # settings they leave behind must still fit the graphs traced in inference mode.
    from omni_core.engine.buckets import StaticPlan
    from omni_core.engine.compiled import StaticContext
    from omni_qwen3_tts.model import Qwen3TTSModel

    model = Qwen3TTSModel.from_pretrained("tiny", load_format="dummy", seed=0)
    predictor = model.talker.code_predictor
    usual = RowSampling(temperature=0.9, top_k=50)
    width = model.config.talker.transformer.hidden_size
    hidden, code0 = torch.randn(2, 3, width, generator=torch.Generator().manual_seed(8))
    compiled_whole = [[usual], [usual, RowSampling(greedy=True), usual]]
    wider = [usual, RowSampling(temperature=1.0, top_p=0.5)]  # step by step

    def frame(rows: list[RowSampling]) -> torch.Tensor:
        batch = len(rows)
        return predictor.generate_frame(hidden[:batch], code0[:batch], rows, _seeded(batch))

    eager = [frame(rows) for rows in [*compiled_whole, wider]]
    context = StaticContext(StaticPlan(True, False, (1, 4), "t"), None)
    predictor.prepare_static(context, *_cpu(), usual)
    context.warm_up()
    whole = predictor.frame_graphs[(4, 50, False)]
    assert predictor.frame_graphs == {(1, 50, False): whole, (4, 50, False): whole}
    assert whole.graphs == 2
    assert context.notes[-1] == (
        "code predictor: each frame's 15 steps and picks compiled as one graph per batch "
        "size (top-k over 50; rows asking for wider sampling pick between compiled steps)"
    )
    for rows, want in zip(compiled_whole, eager[:2], strict=True):
        assert torch.equal(frame(rows), want)
    assert (whole.calls, whole.misses) == (2, 0)
    steps = predictor.static.calls
    with torch.inference_mode():  # as the engine's steps run
        assert torch.equal(frame(wider), eager[-1])
    assert predictor.static.calls == steps + 15 and whole.calls == 2


def test_omni_compile_frames_0_leaves_the_frames_stepping_through_compiled_steps(monkeypatch):
    # Nothing is compiled here: the switch is read before any frame would be.
    monkeypatch.setenv("OMNI_COMPILE_FRAMES", "0")
    predictor = _compiled_predictor_unwarmed()
    note = predictor._build_frames()
    assert note == "code predictor: frames step through the compiled steps (OMNI_COMPILE_FRAMES=0)"
    assert predictor.frame_graphs == {}


def test_a_frame_inductor_cannot_compile_leaves_the_frames_stepping_and_says_why(monkeypatch):
    # A compiler failure cannot be made to happen here on purpose: torch.compile stands in
    # for one (an external tool), failing when the frame is first compiled.
    from omni_core.engine import warm_compiled

    def failing_compile(fn, **options):
        def compiled(*inputs):
            raise RuntimeError("inductor: lowering failed\nmore detail")

        return compiled

    monkeypatch.setattr(warm_compiled.torch, "compile", failing_compile)
    predictor = _compiled_predictor_unwarmed()
    note = predictor._build_frames()
    assert note == (
        "code predictor: frames not compiled whole (RuntimeError: inductor: lowering failed); "
        "each frame steps through the compiled steps"
    )
    assert predictor.frame_graphs == {}


def _compiled_predictor_unwarmed():
    """The tiny code predictor prepared for compiled buckets 1 and 4, nothing compiled yet
    (the steps compile lazily, at the warm-up these tests skip)."""
    from omni_core.engine.buckets import StaticPlan
    from omni_core.engine.compiled import StaticContext
    from omni_qwen3_tts.model import Qwen3TTSModel

    model = Qwen3TTSModel.from_pretrained("tiny", load_format="dummy", seed=0)
    predictor = model.talker.code_predictor
    context = StaticContext(StaticPlan(True, False, (1, 4), "t"), None)
    predictor.prepare_static(context, *_cpu(), RowSampling(temperature=0.9, top_k=50))
    return predictor
