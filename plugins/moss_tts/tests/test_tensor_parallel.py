"""The MOSS-TTS backbone split over two ranks (gloo, two processes) gives the same codes.

Each rank is a real process that forms its group as the runtime's worker
does and builds ``tts_engine`` through the plugin's factory. Rank 0 first
decodes with the unsplit backbone (tp_size 1) for reference, then drives the
split one through its engine; two requests batched together, greedy on the
text and audio channels. The codes must be equal frame for frame (the
all-reduces reorder float additions only). The served demo at tp_size 2
(audio equal to tp_size 1, and a killed rank) is in ``test_serve_tensor_parallel``.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytest.importorskip("torch")

RANK = textwrap.dedent(
    """
    import json, os, sys, anyio, torch
    from omni_core.engine.interface import EngineSettings
    from omni_core.engine.tp import init_group, leave_group
    from omni_moss_tts import stages
    from omni_moss_tts.stages import create_tts_engine

    rank, store, out = int(sys.argv[1]), sys.argv[2], sys.argv[3]
    torch.set_num_threads(1)
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    SETTINGS = EngineSettings(max_running_requests=4, max_total_tokens=4096)
    TEXTS = {"short": "Hello there.", "long": "A second sentence, somewhat longer than the first."}

    def build(tp_size):
        return create_tts_engine("tiny", load_format="dummy", dtype="float32", seed=0,
                                 tp_rank=rank if tp_size > 1 else 0, tp_size=tp_size,
                                 engine_settings=SETTINGS)

    async def speak(stage):
        model, frames = stage.model, {}
        async def one(name, text):
            prompt = model.request(model.prompts.build(text, max_frames=48), text_temperature=0.0)
            greedy = model.audio_sampling(temperature=0.0, max_new_tokens=200)
            rows = []
            async with stage.engine.enqueue(name, prompt, greedy) as stream:
                async for step in stream:
                    rows += step.frames.tolist()
            frames[name] = rows
        async with anyio.create_task_group() as tg:
            for name, text in TEXTS.items():
                tg.start_soon(one, name, text)
        return frames

    async def main():
        if rank == 0:
            alone = build(1)
            reference = await speak(alone)
            await alone.aclose()
            stages.load_model.cache_clear()  # the split run loads its own copy
        init_group(name="tts_engine", rank=rank, size=2, store_path=store, backend="gloo",
                   device="cpu", timeout=120, ranks=["tts_engine_tp0", "tts_engine_tp1"])
        stage = build(2)
        if rank == 0:
            split = await speak(stage)
            await stage.aclose()
            result = {"reference": reference, "split": split}
        else:
            await stage.start()
            await anyio.to_thread.run_sync(stage.join)
            await stage.aclose()
            result = {"steps": stage.steps, "kv_heads": stage.cache.k.shape[2]}
        leave_group()
        with open(out, "w") as f:
            json.dump(result, f)

    anyio.run(main)
    """
)


@pytest.mark.slow  # ~20 s: two rank processes and a reference run (the thinker's is in make test)
def test_two_ranks_give_the_codes_of_one_frame_for_frame(tmp_path: Path):
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                "-c",
                RANK,
                str(rank),
                str(tmp_path / "store"),
                str(tmp_path / f"{rank}"),
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for rank in range(2)
    ]
    for proc in procs:
        output, _ = proc.communicate(timeout=300)
        assert proc.returncode == 0, output
    leader = json.loads((tmp_path / "0").read_text())
    follower = json.loads((tmp_path / "1").read_text())
    for name, frames in leader["reference"].items():
        assert len(frames) > 10, name  # real speech frames, 32 codes each
        assert all(len(frame) == 32 for frame in frames)
        assert leader["split"][name] == frames, name
    assert follower["kv_heads"] == 1  # the tiny backbone's 2 KV heads over 2 ranks
    assert follower["steps"] > 40  # it ran every pass of both requests itself
