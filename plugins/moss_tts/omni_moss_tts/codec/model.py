"""The MOSS audio tokenizer ("Cat" codec): 24 kHz mono audio <-> 32 codes per 1920 samples.

Encoder: fold 240 samples into one 100 Hz step, then causal transformers
with 2x folds between them (100 -> 50 -> 25 -> 12.5 Hz); a residual
quantizer turns each 12.5 Hz latent into ``num_quantizers`` codes. Decoder:
the mirror, transformers with 2x unfolds between them and a final unfold of
240 samples per step. Module names are the release's
(``encoder.N``, ``quantizer``, ``decoder.N``), so its checkpoint loads by
name with nothing left over; folds keep their (parameter-free) slots.

:meth:`AudioTokenizer.decode` is one causal pass over all frames, what the
release's ``decode()`` computes without ``chunk_duration``.
:meth:`AudioTokenizer.stream_rows` decodes the next frames of one or more
streams and, concatenated, equals that one pass (see ``streaming.py`` for
why, and how the release's chunked decode differs).

All state is in parameters (no buffers), so the module can be built on the
``meta`` device and materialised with ``to_empty`` before loading.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from omni_qwen3_tts.codec_footprint import MAX_FRAME_ROWS

from ..codec_footprint import CodecFootprint, codec_footprint
from .config import CodecConfig, PatchSpec
from .patch import Patch
from .quantizer import ResidualQuantizer
from .streaming import CodecStream, WindowShape
from .transformer import KV, ProjectedTransformer

if TYPE_CHECKING:
    from .graphs import CodecStreamGraphs


class AudioTokenizer(nn.Module):
    def __init__(self, cfg: CodecConfig):
        super().__init__()
        self.cfg = cfg
        self.encoder = nn.ModuleList(
            Patch(s.patch_size, fold=True) if isinstance(s, PatchSpec) else ProjectedTransformer(s)
            for s in cfg.encoder
        )
        self.quantizer = ResidualQuantizer(cfg.quantizer)
        # The encoder rotates with the release's arithmetic: its codes are compared bit for
        # bit with the release's. The decoder's waveform is compared within float rounding,
        # and its one complex product costs a fifth to a tenth (codec/attention.py).
        self.decoder = nn.ModuleList(
            Patch(s.patch_size, fold=False)
            if isinstance(s, PatchSpec)
            else ProjectedTransformer(s, exact_rotation=False)
            for s in cfg.decoder
        )

    @property
    def sample_rate(self) -> int:
        return self.cfg.sample_rate

    @property
    def frame_samples(self) -> int:
        return self.cfg.downsample_rate

    @property
    def num_quantizers(self) -> int:
        return self.cfg.num_quantizers

    def _param(self, part: nn.Module | None = None) -> torch.Tensor:
        """A parameter of ``part`` (default the encoder): its device, and the dtype it computes in.

        The encoder and the decoder may differ: a bf16 decoder keeps a float32
        encoder (``loading.load_codec``).
        """
        return next((part or self.encoder).parameters())

    # -- encode ----------------------------------------------------------------------

    @torch.no_grad()
    def encode(self, wav: torch.Tensor) -> torch.Tensor:
        """A prepared 24 kHz clip ``[N]`` -> codes ``[floor(N / 1920), num_quantizers]`` (long).

        "Prepared" means mono and loudness-normalised (:func:`prepare_reference`).
        A trailing partial frame is padded with zeros, encoded and dropped, as
        the release does.
        """
        if wav.dim() != 1:
            raise ValueError(f"encode takes one mono clip [N], got shape {tuple(wav.shape)}")
        return self.encode_batch([wav])[0]

    @torch.no_grad()
    def encode_batch(self, wavs: list[torch.Tensor]) -> list[torch.Tensor]:
        """Several prepared clips at once; one ``[T_i, num_quantizers]`` per clip.

        Clips are zero-padded to a common length; the encoder is causal and
        the quantizer masks frames past each clip's end, so each clip's codes
        are those it gets alone.
        """
        if not wavs:
            return []
        param = self._param()
        hop = self.frame_samples
        frames = [int(w.shape[-1]) // hop for w in wavs]
        padded = math.ceil(max(int(w.shape[-1]) for w in wavs) / hop) * hop
        q = self.num_quantizers
        if padded == 0:
            return [torch.zeros(0, q, dtype=torch.long, device=param.device) for _ in wavs]
        x = torch.zeros(len(wavs), 1, padded, device=param.device, dtype=param.dtype)
        for row, wav in enumerate(wavs):
            x[row, 0, : wav.shape[-1]] = wav.to(device=param.device, dtype=param.dtype)
        for module in self.encoder:
            x = module(x)
        lengths = torch.tensor(frames, device=param.device)
        codes = self.quantizer.encode(x, lengths)  # [Q, B, T]
        return [codes[:, row, :n].t().contiguous() for row, n in enumerate(frames)]

    # -- decode ----------------------------------------------------------------------

    @torch.no_grad()
    def decode(self, codes: torch.Tensor) -> torch.Tensor:
        """Codes ``[T, Q]`` -> float32 audio ``[T * 1920]``, one causal pass."""
        if codes.dim() != 2:
            raise ValueError(f"decode takes codes [T, Q], got shape {tuple(codes.shape)}")
        codes = codes.t()[:, None]  # [Q, 1, T]
        self._check_codes(codes)
        if codes.shape[-1] == 0:
            return torch.zeros(0, device=codes.device)
        return self._decode(codes, None)[0].float()

    def footprint(self) -> CodecFootprint:
        """What a stream and a chunk take beyond the weights (``codec_footprint.py``)."""
        stages, rate = [], 1
        for module in self.decoder:
            if isinstance(module, Patch):
                rate *= module.patch_size
                continue
            spec = module.spec
            stages.append(
                (rate, spec.num_layers, spec.d_model, spec.num_heads, spec.context,
                 spec.dim_feedforward)
            )  # fmt: skip
        itemsize = self._param(self.decoder).element_size()
        return codec_footprint(stages, itemsize, self.cfg.downsample_rate)

    def new_stream(self, batch: int = 1) -> CodecStream:
        """An empty stream state for ``batch`` rows (see :meth:`stream_rows`)."""
        param = self._param(self.decoder)
        shapes = [
            (m.num_layers, *m.kv_shape())
            for m in self.decoder
            if isinstance(m, ProjectedTransformer)
        ]
        return CodecStream.empty(batch, shapes, param.device, param.dtype)

    @torch.no_grad()
    def stream_rows(self, codes: torch.Tensor, state: CodecStream) -> list[torch.Tensor]:
        """The next frames ``[B, Q, T]`` of ``B`` streams -> float32 ``[1, T * 1920]`` per row.

        Rows may be at different points of their streams. ``state`` advances
        by ``T`` frames; concatenating the audio of successive calls equals
        :meth:`decode` of all frames (up to float rounding).
        """
        if codes.dim() != 3:
            raise ValueError(f"stream_rows takes codes [B, Q, T], got shape {tuple(codes.shape)}")
        if codes.shape[0] != state.batch:
            raise ValueError(f"codes have {codes.shape[0]} rows, the stream {state.batch}")
        codes = codes.transpose(0, 1)
        self._check_codes(codes)
        if codes.shape[-1] == 0:
            return [torch.zeros(1, 0, device=codes.device) for _ in range(state.batch)]
        wav = self._decode(codes, state).float()
        return [wav[row : row + 1] for row in range(state.batch)]

    def _check_codes(self, codes: torch.Tensor) -> None:
        """``codes`` ``[Q, B, T]``: a prefix of the codebooks, every id in range."""
        q = codes.shape[0]
        if not 1 <= q <= self.num_quantizers:
            raise ValueError(f"codes have {q} codebooks; this codec has {self.num_quantizers}")
        if codes.dtype not in (torch.int64, torch.int32):
            raise ValueError(f"codes must be integer ids, got {codes.dtype}")
        if codes.numel():
            low, high = int(codes.min()), int(codes.max())
            size = self.cfg.codebook_size
            if low < 0 or high >= size:
                raise ValueError(f"code ids must lie in [0, {size}), got [{low}, {high}]")

    def window_shapes(self) -> list[WindowShape]:
        """(layers, heads, window - 1, head_dim) of each decoder transformer: what a stream
        carries per layer once its windows are full (``streaming.window_views``)."""
        return [
            (m.num_layers, m.spec.num_heads, m.window - 1, m.spec.head_dim)
            for m in self.decoder
            if isinstance(m, ProjectedTransformer)
        ]

    def stream_graphs(
        self,
        rows: Sequence[int],
        frames: Sequence[int],
        capture: Any,
        max_frame_rows: int | None = MAX_FRAME_ROWS,
    ) -> CodecStreamGraphs:
        """This codec's streamed chunks captured as CUDA graphs (``graphs.py``), for the
        vocoder stage, which asks its codec for them: the ``rows`` buckets asked for (the
        stage caps them at its ``factory.cuda_graph_max_bs``, by default
        :data:`~..codec_footprint.CAPTURED_ROWS`)."""
        from .graphs import CodecStreamGraphs

        return CodecStreamGraphs(self, rows, frames, capture, max_frame_rows=max_frame_rows)

    def decode_window(
        self, codes: torch.Tensor, start: torch.Tensor, kv: list[list[KV]]
    ) -> torch.Tensor:
        """Codes ``[B, Q, T]`` of rows at positions ``start`` -> audio ``[B, T * 1920]`` in the
        decoder's dtype, each row's full windows ``kv`` (``window_views``) read and then
        overwritten with the next ones: a captured chunk (nothing read back to the host,
        no shape that depends on a row's age)."""
        x = self.quantizer.decode(codes.transpose(0, 1).long()).to(self._param(self.decoder).dtype)
        x, _ = self._through_decoder(x, start, kv, in_place=True)
        return x[:, 0]

    def _decode(self, codes: torch.Tensor, state: CodecStream | None) -> torch.Tensor:
        """Codes ``[Q, B, T]`` -> audio ``[B, T * 1920]``; with ``state``, continuing its rows."""
        param = self._param(self.decoder)
        x = self.quantizer.decode(codes.to(param.device).long()).to(param.dtype)
        if state is None:
            start = torch.zeros(x.shape[0], dtype=torch.long, device=x.device)
        else:
            start = state.position
        x, carried = self._through_decoder(x, start, None if state is None else state.kv)
        if state is not None:
            state.kv = carried
            state.position = state.position + codes.shape[-1]
            state.advanced()
        return x[:, 0]

    def _through_decoder(
        self,
        x: torch.Tensor,
        start: torch.Tensor,
        kv: list[list[KV]] | None,
        in_place: bool = False,
    ) -> tuple[torch.Tensor, list[list[KV]]]:
        """The latent ``[B, C, T]`` through the decoder's patches and transformers; the
        keys/values each transformer carries on (none without ``kv``)."""
        rate = 1  # steps per frame at the current module
        stage = 0
        carried: list[list[KV]] = []
        for module in self.decoder:
            if isinstance(module, Patch):
                x = module(x)
                rate *= module.patch_size
                continue
            past = None if kv is None else kv[stage]
            x, kept = module.run(x, start * rate, past, in_place=in_place)
            if kept is not None:
                carried.append(kept)
            stage += 1
        return x, carried
