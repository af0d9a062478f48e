"""The thinker split over two ranks (gloo, two processes) decodes the tokens one process does.

Each rank is a real process that forms its group as the runtime's worker
does and builds the stage through the plugin's own factory; rank 0 first
decodes with an unsplit thinker (tp_size 1) for reference, then drives the
split one through its engine: text-only prompts and one with spliced encoder
rows and deepstack additions (what an image brings), batched together.
Greedy tokens must be equal: the all-reduces change only the order of float
additions, and the tiny model's margins are far wider than that at float32.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

RANK = textwrap.dedent(
    """
    import json, os, sys, anyio, torch
    from omni_core.engine.interface import EngineSettings, SamplingParams
    from omni_core.engine.prompt import EmbeddedPrompt
    from omni_core.engine.tp import init_group, leave_group
    from omni_qwen3_omni.loading import load_part
    from omni_qwen3_omni.stages import create_thinker

    rank, store, out = int(sys.argv[1]), sys.argv[2], sys.argv[3]
    torch.set_num_threads(1)
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    SETTINGS = EngineSettings(max_running_requests=4, max_total_tokens=2048)
    # the split run prefills in chunks of 16: the 40-token prompt takes three steps
    CHUNKED = EngineSettings(max_running_requests=4, max_total_tokens=2048, max_prefill_tokens=16)

    def build(tp_size):
        return create_thinker("tiny", load_format="dummy", dtype="float32", seed=0,
                              tp_rank=rank if tp_size > 1 else 0, tp_size=tp_size,
                              engine_settings=SETTINGS if tp_size == 1 else CHUNKED)

    def prompts():
        g = torch.Generator().manual_seed(5)
        image = EmbeddedPrompt(
            token_ids=[11, 12, 13, 14, 15, 16, 17],
            embeddings=torch.randn(3, 32, generator=g),
            embedding_index=torch.tensor([2, 3, 4]),
            layer_additions=[torch.randn(3, 32, generator=g) for _ in range(2)],
            addition_index=torch.tensor([2, 3, 4]),
        )
        return {"text": EmbeddedPrompt(token_ids=[101, 2023, 318, 257]),
                "long": EmbeddedPrompt(token_ids=list(range(300, 340))),
                "image": image}

    async def decode(thinker):
        results = {}
        async def one(name, prompt):
            greedy = SamplingParams(temperature=0, max_new_tokens=16)
            async with thinker.engine.enqueue(name, prompt, greedy) as stream:
                results[name] = [int(t) async for t in stream]
        async with anyio.create_task_group() as tg:
            for name, prompt in prompts().items():
                tg.start_soon(one, name, prompt)
        return results

    async def main():
        if rank == 0:
            alone = build(1)
            await alone.start()
            reference = await decode(alone)
            await alone.aclose()
            load_part.cache_clear()  # the split run loads its own copy
        init_group(name="thinker", rank=rank, size=2, store_path=store, backend="gloo",
                   device="cpu", timeout=120, ranks=["thinker_tp0", "thinker_tp1"])
        stage = build(2)
        await stage.start()
        if rank == 0:
            split = await decode(stage)
            kv = stage.engine.cache.k.shape[2]
            chunks = stage.engine.prefill_chunks
            await stage.aclose()
            result = {"reference": reference, "split": split, "kv_heads": kv, "chunks": chunks}
        else:
            await anyio.to_thread.run_sync(stage.join)
            await stage.aclose()
            result = {"steps": stage.steps, "kv_heads": stage.cache.k.shape[2]}
        leave_group()
        with open(out, "w") as f:
            json.dump(result, f)

    anyio.run(main)
    """
)


def test_two_ranks_decode_the_greedy_tokens_of_one(tmp_path: Path):
    """Two tensor-parallel ranks, prompts prefilled in chunks, say what one rank says
    prefilling them whole."""
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
    assert leader["split"] == leader["reference"]  # the split run's prompts in chunks
    assert leader["chunks"] >= 2
    assert all(len(tokens) == 16 for tokens in leader["split"].values())
    assert leader["kv_heads"] == follower["kv_heads"] == 1  # 2 KV heads over 2 ranks
    assert follower["steps"] >= 16  # it ran the passes itself (prefills and decodes)


def test_the_sglang_adapter_hands_sglang_the_stage_tp_size():
    from omni_qwen3_omni.thinker.sglang_adapter import ThinkerSGLangModel

    model = ThinkerSGLangModel(Path("/nonexistent"), eos_ids={1}, hidden_size=8, tp_size=2)
    args, _ = model.launch()
    assert args["tp_size"] == 2
