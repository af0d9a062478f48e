"""A voice conversation with the Qwen3-Omni talker: each turn's time to first frame, with
the earlier user turns copied from the previous turn's slot (the engine's shared prompt
heads) and computed whole (``engine.disable_radix_cache``).

Run: ``python benchmarks/bench_talker_conversation.py [--talker-layers 2] [--turns 4]
[--audio 150] [--text 24] [--dtype bfloat16] [--threads 2]`` (about a minute on two CPU
cores); ``--smoke``: tiny widths, two short turns, seconds.

What runs: the talker at the release's width (``bench_qwen3_omni_speech``'s config:
hidden 1024, 128 experts top-6 of width 384 and a shared expert, its code predictor
whole) with ``--talker-layers`` layers and seeded random weights, loaded and packed as
the talker stage loads it, on the ``TorchEngine`` the stage runs. The talker's prompt
is what the release gives it: every user turn of the chat so far (earlier answers
and the system prompt are left out), then the assistant turn's nine positions. Each
user turn leads with ``--audio`` audio positions (the thinker's accept-layer rows
there, random as an encoder's would be) and ``--text`` text tokens; the thinker's
rows of a turn are the same in every later turn, as a thinker that copied that turn
hands them over. Each turn's talker request runs to its first two frames; its time
to first frame is its prefill and first code-predictor pass. Each setting runs the
whole conversation ``--repeats`` times, taking turns; each turn's fastest is kept.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import anyio
import torch

from omni_core.engine.backends import create_engine
from omni_core.engine.compute import dedicate
from omni_core.engine.interface import EngineSettings, SamplingParams
from omni_core.sigterm import run_script
from omni_qwen3_omni.config import ThinkerConfig
from omni_qwen3_omni.loading import load_part, read_raw_config, resolve_model_path
from omni_qwen3_omni.talker.config import TalkerConfig
from omni_qwen3_omni.talker.prompt import TalkerPrompt
from omni_qwen3_omni.talker.step import TalkerStepModel
from omni_qwen3_omni.thinker.cpu_weights import pack_decoder_weights
from omni_qwen3_omni.thinker.positions import MediaTokens, prompt_positions

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_qwen3_omni_speech as speech  # the release-width config

IM_START, IM_END, NL = 151644, 151645, 198
SYSTEM, USER, ASSISTANT = 8948, 872, 77091


def build(
    args: argparse.Namespace, workdir: Path
) -> tuple[TalkerStepModel, TalkerConfig, MediaTokens]:
    """The talker as the stage builds it, from a config at the release's width (or the
    tiny preset's with ``--smoke``)."""
    if args.smoke:
        model_path = "tiny"
    else:
        config = speech.root_config(
            argparse.Namespace(
                layers=2, vision_depth=1, talker_layers=args.talker_layers, code2wav_layers=1
            )
        )
        (workdir / "config.json").write_text(json.dumps(config))
        model_path = str(workdir)
    raw = read_raw_config(resolve_model_path(model_path).path)
    talker, _, _ = load_part(model_path, "talker_ar", "dummy", args.dtype, "cpu", args.seed)
    pack_decoder_weights(talker)  # the talker stage's factory.pack_weights on the CPU
    cfg = TalkerConfig.from_dict(raw)
    dtype = next(talker.parameters()).dtype
    media = MediaTokens.from_config(ThinkerConfig.from_dict(raw))
    return TalkerStepModel(talker, cfg, device=torch.device("cpu"), dtype=dtype), cfg, media


class Chat:
    """A chat's thinker-side ids and rows: each segment's rows drawn once, so a turn's rows
    are the same in every later prompt."""

    def __init__(self, cfg: TalkerConfig, media: MediaTokens, args: argparse.Namespace, seed: int):
        self.cfg, self.media, self.width = cfg, media, cfg.thinker_hidden_size
        self.gen = torch.Generator().manual_seed(seed)
        self.ids: list[int] = []
        self.layer0: list[torch.Tensor] = []
        self.accept: list[torch.Tensor] = []
        self._segment([IM_START, SYSTEM, NL, *self._words(32), IM_END, NL])
        self.tts = torch.randn(3, self.width, generator=self.gen)
        self.args = args

    def _words(self, n: int) -> list[int]:
        return torch.randint(1000, 5000, (n,), generator=self.gen).tolist()

    def _segment(self, ids: list[int]) -> None:
        self.ids += ids
        self.layer0.append(torch.randn(len(ids), self.width, generator=self.gen))
        self.accept.append(torch.randn(len(ids), self.width, generator=self.gen))

    def user(self) -> None:
        audio = [self.media.audio_start, *[self.media.audio] * self.args.audio, 151670]
        self._segment([IM_START, USER, NL, *audio, *self._words(self.args.text), IM_END, NL])

    def answer(self) -> None:
        self._segment([IM_START, ASSISTANT, NL, *self._words(self.args.answer), IM_END, NL])

    def talker_prompt(self) -> TalkerPrompt:
        """The talker's prompt for the open assistant turn after the chat so far."""
        ids = [*self.ids, IM_START, ASSISTANT, NL]
        opening = torch.randn(3, self.width, generator=torch.Generator().manual_seed(1))
        layer0 = torch.cat([*self.layer0, opening])
        accept = torch.cat([*self.accept, opening])
        prompt = TalkerPrompt(self.cfg, "ethan")
        positions = prompt_positions(ids, self.media).positions
        prompt.add_prompt(ids, layer0, accept, tts_embeddings=self.tts, positions=positions)
        first = torch.randn(1, self.width, generator=torch.Generator().manual_seed(2))
        prompt.add_tokens([1234], first)
        prompt.finish()
        return prompt


async def conversation(
    model: TalkerStepModel, prompts: list[TalkerPrompt], warm: TalkerPrompt, radix: bool
) -> tuple[list[float], dict[str, int]]:
    """Each turn's time to first frame (s); the prompt positions computed and copied.

    ``warm``: another chat's prompt, run first (the first call at a shape pays more).
    """
    longest = max(p.prefill_length for p in prompts) + 16
    settings = EngineSettings(
        max_running_requests=2,
        max_total_tokens=2 * longest,
        max_prefill_tokens=longest,
        disable_radix_cache=not radix,
    )
    firsts = []
    async with create_engine(model, settings, device="cpu") as engine:
        sampling = SamplingParams(0.0, max_new_tokens=2)
        _ = [frame async for frame in engine.enqueue("warm", warm, sampling)]
        engine.prompt_positions.update(computed=0, cached=0)
        for number, prompt in enumerate(prompts):
            sampling = SamplingParams(0.0, repetition_penalty=1.05, max_new_tokens=2)
            begin, first = time.perf_counter(), None
            async for _ in engine.enqueue(f"turn{number}", prompt, sampling):
                if first is None:
                    first = time.perf_counter() - begin
            firsts.append(float(first))
        counts = dict(engine.prompt_positions)
    return firsts, counts


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--talker-layers", type=int, default=2, help="talker layers (release: 20)")
    parser.add_argument("--dtype", default="bfloat16", help="the talker stage's factory.dtype")
    parser.add_argument("--turns", type=int, default=4, help="user turns")
    parser.add_argument("--audio", type=int, default=150, help="audio positions per user turn")
    parser.add_argument("--text", type=int, default=24, help="text tokens per user turn")
    parser.add_argument("--answer", type=int, default=32, help="tokens per earlier answer")
    parser.add_argument("--repeats", type=int, default=2, help="conversations per setting")
    parser.add_argument("--threads", type=int, default=2, help="torch threads")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--smoke", action="store_true", help="the tiny preset, two short turns: checks it runs"
    )
    args = parser.parse_args()
    if args.smoke:
        args.turns, args.audio, args.text, args.answer, args.repeats = 2, 20, 4, 4, 1
    if args.turns < 2:
        print("--turns must be 2 or more: the first turn has nothing to copy", file=sys.stderr)
        return 2
    torch.set_num_threads(args.threads)
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="omni-talker-") as workdir:
        try:
            model, cfg, media = build(args, Path(workdir))
        except ValueError as exc:  # a dtype this device cannot run
            print(f"--dtype: {exc}", file=sys.stderr)
            return 2
    dedicate(args.threads)  # what a stage process does once built (engine/compute.py)
    chat = Chat(cfg, media, args, args.seed)
    other = Chat(cfg, media, args, args.seed + 1)
    other.user()
    warm = other.talker_prompt()
    prompts = []
    for number in range(args.turns):
        if number:
            chat.answer()
        chat.user()
        prompts.append(chat.talker_prompt())
    width = "the tiny preset's" if args.smoke else "the release's"
    print(
        f"Qwen3-Omni talker at {width} width, {cfg.text.num_hidden_layers} of 20 layers, "
        f"{str(model.dtype).removeprefix('torch.')}, {args.threads} torch thread(s), built in "
        f"{time.perf_counter() - started:.1f} s; {args.turns} user turns of {args.audio} "
        f"audio positions and {args.text} text tokens"
    )
    best: dict[bool, list[float]] = {}
    counts: dict[bool, dict[str, int]] = {}
    for _ in range(args.repeats):
        for radix in (False, True):
            firsts, counts[radix] = anyio.run(conversation, model, prompts, warm, radix)
            old = best.get(radix, firsts)
            best[radix] = [min(a, b) for a, b in zip(old, firsts, strict=True)]
    print("\nturn  talker prompt  first frame s (computed whole)  (earlier turns copied)  ratio")
    for number, prompt in enumerate(prompts):
        whole, copied = best[False][number], best[True][number]
        print(
            f"{number + 1:>4}  {prompt.prefill_length:>13}  {whole:>29.3f}  {copied:>22.3f}  "
            f"{whole / copied:>5.2f}x"
        )
    print(
        f"talker prompt positions computed {counts[False]['computed']} -> "
        f"{counts[True]['computed']}, copied {counts[True]['cached']}"
    )
    record = {
        "talker_layers": args.talker_layers,
        "dtype": str(model.dtype).removeprefix("torch."),
        "threads": args.threads,
        "audio": args.audio,
        "prompt_lengths": [p.prefill_length for p in prompts],
        "first_frame_whole_s": best[False],
        "first_frame_copied_s": best[True],
        "positions_whole": counts[False],
        "positions_copied": counts[True],
    }
    print("BENCH_JSON " + json.dumps(record))
    return 0


if __name__ == "__main__":
    run_script(main)
