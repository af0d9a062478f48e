"""The code predictor ("sub-talker"): codebooks 1..G-1 of one frame, given codebook 0.

Per frame it sees two inputs — the talker's last hidden state and the
embedding of the frame's codebook-0 id — and then feeds back each code it
picks through that codebook's own embedding, reading the matching head. Its
KV cache lives only for one frame (G positions), so it is a local scratch
buffer here, shared by every sequence of a batch: all rows step in lockstep
and need no padding.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from omni_core.engine.buckets import bucket_for

from .config import TransformerConfig
from .layers import DecoderStack, rope_cos_sin
from .sampling import (
    RowSampling,
    RowSettings,
    draw_tokens,
    frame_settings,
    frame_uniforms,
    select_tokens,
)


class ScratchKV:
    """A dense per-frame cache ``[layers, B, kv_heads, capacity, head_dim]`` filled in order."""

    def __init__(
        self,
        layers: int,
        batch: int,
        kv_heads: int,
        capacity: int,
        head_dim: int,
        like: torch.Tensor,
    ):
        shape = (layers, batch, kv_heads, capacity, head_dim)
        self.k = torch.empty(shape, dtype=like.dtype, device=like.device)
        self.v = torch.empty(shape, dtype=like.dtype, device=like.device)
        self.length = 0
        self._layers = layers

    def update(
        self, layer: int, k: torch.Tensor, v: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        stop = self.length + k.shape[2]
        self.k[layer, :, :, self.length : stop] = k
        self.v[layer, :, :, self.length : stop] = v
        if layer == self._layers - 1:
            self.length = stop
        return self.k[layer, :, :, :stop], self.v[layer, :, :, :stop]


class CodePredictorModel(DecoderStack):
    """Decoder stack plus the embeddings of codebooks 1..G-1 (width = the talker's hidden)."""

    def __init__(self, cfg: TransformerConfig, embedding_dim: int):
        super().__init__(cfg)
        self.cfg = cfg
        self.codec_embedding = nn.ModuleList(
            nn.Embedding(cfg.vocab_size, embedding_dim) for _ in range(cfg.num_code_groups - 1)
        )

    def forward(self, x: torch.Tensor, start: int, store: ScratchKV) -> torch.Tensor:
        steps = x.shape[1]
        positions = torch.arange(start, start + steps, device=x.device)[None].expand(x.shape[0], -1)
        mask = None
        if steps > 1:
            total = start + steps
            q = torch.arange(start, total, device=x.device)[:, None]
            mask = (torch.arange(total, device=x.device)[None, :] <= q)[None, None]
        return self.step(x, positions, mask, store)

    def step(
        self, x: torch.Tensor, positions: torch.Tensor, mask: torch.Tensor | None, store: Any
    ) -> torch.Tensor:
        """The stack on rows ``x`` ``[B, T, H]`` at ``positions`` ``[B, T]`` (a static step)."""
        cos, sin = rope_cos_sin(positions, self.inv_freq, x.dtype)
        return self.run_layers(x, cos, sin, mask, store)


class CodePredictor(nn.Module):
    """``talker.code_predictor``: model, one head per codebook 1..G-1, optional input projection."""

    def __init__(self, cfg: TransformerConfig, talker_hidden: int):
        super().__init__()
        self.cfg = cfg
        self.model = CodePredictorModel(cfg, talker_hidden)
        self.lm_head = nn.ModuleList(
            nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
            for _ in range(cfg.num_code_groups - 1)
        )
        # The 1.7B talker is wider than its predictor: project its inputs down.
        self.small_to_mtp_projection: nn.Module = nn.Identity()
        if cfg.hidden_size != talker_hidden:
            self.small_to_mtp_projection = nn.Linear(talker_hidden, cfg.hidden_size, bias=True)

    def embed_codes(self, codes: torch.Tensor) -> torch.Tensor:
        """Sum of the embeddings of codebooks 1..G-1: ``codes`` ``[..., G-1]`` -> ``[..., H]``."""
        total = self.model.codec_embedding[0](codes[..., 0])
        for i in range(1, codes.shape[-1]):
            total = total + self.model.codec_embedding[i](codes[..., i])
        return total

    @torch.no_grad()
    def generate_frame(
        self,
        talker_hidden: torch.Tensor,
        code0_embedding: torch.Tensor,
        rows: list[RowSampling],
        generators: list[torch.Generator | None],
    ) -> torch.Tensor:
        """Codes of codebooks 1..G-1 ``[B, G-1]`` for a batch of frames.

        ``talker_hidden`` ``[B, H]``: the talker's final hidden state that
        produced codebook 0; ``code0_embedding`` ``[B, H]``: that code's
        talker embedding. A drawing row takes its frame's G-1 numbers from
        its generator before the first pick (:func:`frame_uniforms`), so
        the eager, static and captured frames pick the same codes.
        """
        cfg = self.cfg
        groups = cfg.num_code_groups
        x = torch.stack((talker_hidden, code0_embedding), dim=1)
        x = self.small_to_mtp_projection(x)
        draws = [r.draws for r in rows]
        uniforms = frame_uniforms(generators, draws, groups - 1, x.device) if any(draws) else None

        def pick(i: int, logits: torch.Tensor) -> torch.Tensor:
            column = None if uniforms is None else uniforms[:, i]
            return select_tokens(logits, rows, generators, uniforms=column)

        static = getattr(self, "static", None)
        if static is not None and static.fits(x):
            return self._static_frame(static, x, rows, uniforms, pick)
        store = ScratchKV(
            cfg.num_hidden_layers, x.shape[0], cfg.num_key_value_heads, groups, cfg.head_dim, x
        )
        hidden = self.model(x, 0, store)
        codes = []
        for i in range(groups - 1):
            code = pick(i, self.lm_head[i](hidden[:, -1]))
            codes.append(code)
            if i == groups - 2:
                break
            nxt = self.small_to_mtp_projection(self.model.codec_embedding[i](code))[:, None]
            hidden = self.model(nxt, store.length, store)
        return torch.stack(codes, dim=1)

    def prepare_static(
        self,
        context: Any,
        dtype: torch.dtype,
        device: torch.device,
        usual: RowSampling | None = None,
    ) -> None:
        """Build the static-shape step the engine compiles (see ``omni_core.engine.compiled``).

        Its cache is its own: one row per bucket row, ``num_code_groups``
        positions. Where the step is captured as CUDA graphs, each bucket's
        whole frame (G-1 steps and picks) is captured too, once the engine's
        warm-up has captured the step (:meth:`_capture_frames`): one graph
        that serves any settings (top-k over the whole vocabulary, top-p
        always applied: two sorts a pick) and, for ``usual`` (the settings
        most requests keep, the release's predictor defaults), one that
        filters only as wide as they ask. Where it is compiled without CUDA
        graphs (the CPU), each bucket's whole frame is compiled as one graph
        for the narrowest of those (:meth:`_compile_frames`).
        """
        cfg = self.cfg
        self.static = context.scratch_decoder(
            "code predictor",
            self.model.step,
            layers=cfg.num_hidden_layers,
            kv_heads=cfg.num_key_value_heads,
            capacity=cfg.num_code_groups,
            head_dim=cfg.head_dim,
            dtype=dtype,
            device=device,
            hidden=cfg.hidden_size,
            steps=(1, 2),
        )
        self.frame_graphs: dict[tuple[int, int, bool], Any] = {}  # (bucket, widest, nucleus)
        self.frame_shapes = [(cfg.vocab_size, True)]
        if usual is not None and usual.draws:
            narrow = (min(usual.top_k, cfg.vocab_size), usual.top_p < 1.0)
            if narrow != self.frame_shapes[0] and narrow[0] > 0:
                self.frame_shapes.insert(0, narrow)
        context.after_warm_up(self._build_frames)

    def _static_frame(
        self,
        static: Any,
        x: torch.Tensor,
        rows: list[RowSampling],
        uniforms: torch.Tensor | None,
        pick: Callable[[int, torch.Tensor], torch.Tensor],
    ) -> torch.Tensor:
        """:meth:`generate_frame` through the static step: the same codes, static shapes.

        A bucket whose frame was captured replays it: one launch for the
        frame's 15 steps and picks, where stepping them from Python
        launched ~60 small kernels a pick (the GPU check's profile of
        Qwen3-TTS at c=8: 936 launches an engine step).
        """
        batch = x.shape[0]
        bucket = bucket_for(batch, static.buckets)
        if bucket is None or not self.frame_graphs:
            return self._frame_codes(static, x, pick)
        groups = self.cfg.num_code_groups
        if uniforms is None:
            uniforms = x.new_zeros((batch, groups - 1), dtype=torch.float32)
        # Inference tensors, as at warm-up, whoever calls: a compiled frame guards on it.
        with torch.inference_mode():
            settings = frame_settings(tuple(rows), bucket, self.cfg.vocab_size, x.device)
            # the narrowest graph whose filters hold every row's (draw_tokens: same picks)
            # among those built (compiled on the CPU: only the usual settings' frame)
            graph = next(
                (
                    self.frame_graphs[key]
                    for key in ((bucket, *shape) for shape in self.frame_shapes)
                    if key in self.frame_graphs
                    and key[1] >= settings.widest
                    and (key[2] or not settings.nucleus)
                ),
                None,
            )
            extra = bucket - batch
            codes = None
            if graph is not None:
                codes = graph(
                    F.pad(x, (0, 0, 0, 0, 0, extra)),
                    settings.greedy,
                    settings.temperature,
                    settings.kth,
                    settings.top_p,
                    F.pad(uniforms, (0, 0, 0, extra)),
                )
        if codes is None:  # no frame graph for these settings, or none fits (said once)
            return self._frame_codes(static, x, pick)
        return codes[:batch].clone()  # the graph's output buffer: the next replay rewrites it

    def _frame_codes(
        self,
        step: Callable[..., torch.Tensor],
        x: torch.Tensor,
        pick: Callable[[int, torch.Tensor], torch.Tensor],
    ) -> torch.Tensor:
        """A frame's codes with ``step(x, positions, cache_pos, slots)`` as the decoder and
        ``pick(i, logits)`` choosing codebook ``i + 1``: static shapes throughout."""
        batch, groups = x.shape[0], self.cfg.num_code_groups
        slots = torch.arange(batch, device=x.device)
        # contiguous: a compiled step guards on strides (see StaticDecoder._padded)
        where = torch.arange(2, device=x.device).repeat(batch, 1)
        hidden = step(x, where, where, slots)
        codes = []
        for i in range(groups - 1):
            code = pick(i, self.lm_head[i](hidden[:, -1]))
            codes.append(code)
            if i == groups - 2:
                break
            nxt = self.small_to_mtp_projection(self.model.codec_embedding[i](code))[:, None]
            where = torch.full((batch, 1), i + 2, dtype=torch.long, device=x.device)
            hidden = step(nxt, where, where, slots)
        return torch.stack(codes, dim=1)

    def capturable_frame(
        self, static: Any, widest: int, nucleus: bool, *, traced: bool = False
    ) -> Callable[..., torch.Tensor]:
        """The function a bucket's frame graph holds: every input a tensor of fixed shape.

        ``frame(x, greedy, temperature, kth, top_p, uniforms)`` -> codes
        ``[bucket, G-1]``; the settings are :func:`frame_settings`' tensors,
        ``uniforms`` :func:`frame_uniforms`'. The picks filter top-k over
        ``widest`` scores and apply top-p where ``nucleus``: for every batch
        whose rows ask for no wider top-k and (without ``nucleus``) no top-p,
        the same codes as the batch's own settings (:func:`draw_tokens`).
        ``traced``: the frame is to be compiled whole, so it steps with the
        step's plain body (``StaticDecoder.body``), not the compiled step.
        """
        plain = static.body() if traced else None
        step = plain or functools.partial(static._step, span=static.spans[-1])

        def frame(
            x: torch.Tensor,
            greedy: torch.Tensor,
            temperature: torch.Tensor,
            kth: torch.Tensor,
            top_p: torch.Tensor,
            uniforms: torch.Tensor,
        ) -> torch.Tensor:
            settings = RowSettings(greedy, temperature, top_p, kth, widest, nucleus)

            def pick(i: int, logits: torch.Tensor) -> torch.Tensor:
                return draw_tokens(logits.float(), settings, uniforms[:, i])

            return self._frame_codes(step, x, pick)

        return frame

    def frame_example(self, static: Any, bucket: int) -> tuple[torch.Tensor, ...]:
        """Inputs of a bucket's frame made of greedy padding rows (to capture it)."""
        device, groups = static.device, self.cfg.num_code_groups
        settings = frame_settings((), bucket, self.cfg.vocab_size, device)
        x = torch.zeros(bucket, 2, static.hidden, dtype=static.dtype, device=device)
        uniforms = torch.zeros(bucket, groups - 1, device=device)
        return x, settings.greedy, settings.temperature, settings.kth, settings.top_p, uniforms

    def _build_frames(self) -> str | None:
        """After the engine's warm-up: each bucket's whole frame as one graph; a note.

        Captured as CUDA graphs where the step was; compiled where the step
        was compiled without them and its weights are not packed into each
        graph (a prepacked step's graphs hold their own copy of the weights,
        and a frame's would add one more), unless ``OMNI_COMPILE_FRAMES=0``.
        """
        from omni_core.engine.warm_compiled import FRAMES_SWITCH, frames_wanted

        static = self.static
        if not static.enabled:
            return None
        if static.use_graphs:
            return self._capture_frames()
        if not (static.plan.compile and not static.prepacked):
            return None
        if not frames_wanted():
            return f"code predictor: frames step through the compiled steps ({FRAMES_SWITCH}=0)"
        return self._compile_frames()

    def _compile_frames(self) -> str:
        """Compile each bucket's whole frame for the usual settings (the first frame shape).

        Why: on the CPU a frame stepped from Python enters the compiled step
        16 times and runs its 15 picks eagerly between them; one graph for
        the frame does neither (Qwen3-TTS 0.6B, ``w8a8_int8``, one row, two
        cores: 69.7 against 79.1 ms a frame). Only the usual settings' frame
        is compiled (it serves greedy rows too): each costs a compile per
        bucket at start-up (at the release's size about 6 s with inductor's
        cache warm, 55 cold; ``OMNI_COMPILE_FRAMES=0`` skips them), and a
        batch with wider settings steps through the compiled step as before.
        A frame inductor cannot compile leaves every frame stepping so, and
        the note says why: the stage still starts.
        """
        from omni_core.engine.warm_compiled import WarmCompiled

        static = self.static
        widest, nucleus = self.frame_shapes[0]
        frame = WarmCompiled(
            "code predictor frame", self.capturable_frame(static, widest, nucleus, traced=True)
        )
        try:
            for bucket in sorted(static.buckets, reverse=True):
                frame.compile(*self.frame_example(static, bucket))
                self.frame_graphs[(bucket, widest, nucleus)] = frame
        except Exception as exc:  # fail soft: the compiled steps still serve every frame
            self.frame_graphs.clear()
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
            return (
                f"code predictor: frames not compiled whole ({type(exc).__name__}: {first}); "
                "each frame steps through the compiled steps"
            )
        shape = f"top-k over {widest}" + (" and top-p" if nucleus else "")
        return (
            f"code predictor: each frame's {self.cfg.num_code_groups - 1} steps and picks "
            f"compiled as one graph per batch size ({shape}; rows asking for wider sampling "
            "pick between compiled steps)"
        )

    def _capture_frames(self) -> str | None:
        """Capture each bucket's whole frame (the step itself was captured); a note."""
        static = self.static
        from omni_core.engine.cuda_graphs import CapturedStep, graph_pool

        pool = graph_pool(static.device)
        try:
            for widest, nucleus in self.frame_shapes:
                frame = self.capturable_frame(static, widest, nucleus)
                for bucket in sorted(static.buckets, reverse=True):
                    example = self.frame_example(static, bucket)
                    graph = CapturedStep(frame, example, pool=pool)
                    self.frame_graphs[(bucket, widest, nucleus)] = graph
        except RuntimeError as exc:  # fail soft: the per-pick path still runs captured steps
            self.frame_graphs.clear()
            return (
                f"code predictor: frames not captured whole ({type(exc).__name__}: {exc}); "
                "each pick runs eagerly between captured steps"
            )
        picks = self.cfg.num_code_groups - 1
        shapes = ", ".join(
            f"top-k over {w}" + (" and top-p" if n else "") for w, n in self.frame_shapes
        )
        return (
            f"code predictor: each frame's {picks} steps and picks captured as one CUDA graph "
            f"per batch size ({shapes})"
        )
