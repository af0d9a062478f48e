"""Parity with transformers' ``qwen3_omni_moe`` (opt-in: ``-m reference``).

``tests/reference/make_reference.py`` runs in the reference environment
(transformers 4.57.3): it writes a sharded tiny checkpoint with the library's
own classes, ``save_pretrained`` and processor files, from a config unlike our
``tiny`` preset, and records, for five prompts (text; one image; two images of
different sizes; audio; image + audio), the default processor's ids, features
and pixels, the encoders' outputs, the thinker's hidden states and its greedy
tokens. Its docstring documents the output layout; the session fixture below
runs it once (about 20 s).

What is compared here (see ``tests/REFERENCE.md``):

1. loading: each understanding part loads strictly (no missing, unexpected or
   misshapen tensor), and the stage prefixes take every tensor exactly once;
2. preprocessing: our preprocessing stage, fed OpenAI-style messages with
   ``data:`` URLs of the very files the processor read, gives the same ids,
   M-RoPE positions, rope delta, mel features and image patches;
3. encoders: the audio and vision towers (through their stage wrappers) on
   our features, against the reference's towers on its own;
4. thinker: every ``hidden_states`` entry of a full-prompt forward, the last
   logits, and 32 greedy tokens through :class:`ThinkerStepModel` on the real
   engine, each case alone and all five at once.

Skipped unless ``QWEN_TTS_REF_PYTHON`` names the reference environment's python
(``make test-reference`` sets it).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from reference_support import opt_in
from understanding_support import (
    CASES,
    MAX_NEW,
    PARTS,
    case_entry,
    case_tensors,
    first_difference,
    greedy,
    load_parts,
    our_cases,
    rel_l2,
    run_understanding_reference,
)

from omni_core.engine.prompt import EmbeddedPrompt, splice_embeddings
from omni_qwen3_omni.audio.mel import audio_token_count
from omni_qwen3_omni.chat import ChatPrompter
from omni_qwen3_omni.checkpoint import OWNERS, Checkpoint, check_coverage
from omni_qwen3_omni.vision.processor import image_token_count

REL_L2 = 1e-4

pytestmark = opt_in


# -- the reference, run once --------------------------------------------------------


@pytest.fixture(scope="session")
def reference(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict]:
    """Run the reference once: (checkpoint directory, manifest with ``ref_dir`` added)."""
    return run_understanding_reference(tmp_path_factory.mktemp("qwen3_omni_reference"))


# -- our side: parts, preprocessing, encoders, prompts -------------------------------


#: Where each part's state keys start in the checkpoint (``load_into``'s ``strip``).
STRIP = {
    "audio_encoder": "thinker.audio_tower.",
    "image_encoder": "thinker.visual.",
    "thinker": "thinker.",
}


@pytest.fixture(scope="session")
def parts(reference) -> dict[str, Any]:
    """Each understanding part loaded from the reference checkpoint (strict), float32 on CPU."""
    return load_parts(reference[0], "float32")


@pytest.fixture(scope="session")
def ours(reference, parts) -> dict[str, dict[str, Any]]:
    """Per case: our preprocessing output, encoder outputs and thinker prompt."""
    return our_cases(*reference, parts)


# -- 1. loading ---------------------------------------------------------------------


def test_checkpoint_is_sharded_under_the_release_prefixes(reference):
    ckpt, _ = reference
    index = json.loads((ckpt / "model.safetensors.index.json").read_text())
    weight_map = index["weight_map"]
    shards = set(weight_map.values())
    assert len(shards) > 1, "the reference checkpoint should be sharded"
    assert all((ckpt / shard).is_file() for shard in shards)
    assert not (ckpt / "model.safetensors").exists()
    prefixes = ("thinker.", "talker.", "code2wav.")
    assert [k for k in weight_map if not k.startswith(prefixes)] == []
    for prefix in prefixes:
        assert any(k.startswith(prefix) for k in weight_map), prefix


def test_reference_used_the_default_fast_image_processor(reference):
    _, manifest = reference
    assert manifest["transformers_version"] == "4.57.3"
    assert manifest["image_processor"] == "Qwen2VLImageProcessorFast"


def test_every_tensor_has_exactly_one_owner(reference):
    ckpt, _ = reference
    checkpoint = Checkpoint.open(ckpt)
    taken = check_coverage(checkpoint, OWNERS)
    claimed = [name for names in taken.values() for name in names]
    assert len(claimed) == len(set(claimed)) == len(checkpoint.weight_map)
    assert set(claimed) == set(checkpoint.weight_map)
    for part in (*PARTS, "talker_ar", "code2wav"):
        assert taken[part], f"no tensor for {part}"


@pytest.mark.parametrize("part", PARTS)
def test_part_loads_with_zero_unmatchedcase_tensors(reference, parts, part):
    """``load_part`` is strict (it raises on any unmatched tensor); the names agree both ways."""
    ckpt, _ = reference
    module = parts["modules"][part]
    checkpoint = Checkpoint.open(ckpt)
    names = {n.removeprefix(STRIP[part]) for n in checkpoint.names(OWNERS[part])}
    assert set(module.state_dict()) == names
    # The values are the checkpoint's, bit for bit (spot-check the first tensor of each shard).
    from safetensors import safe_open

    state = module.state_dict()
    for shard in checkpoint.shards_for(OWNERS[part]):
        with safe_open(str(ckpt / shard), framework="pt") as handle:
            first = next(k for k in sorted(handle.keys()) if k.startswith(OWNERS[part]))
            assert torch.equal(state[first.removeprefix(STRIP[part])], handle.get_tensor(first))


def test_config_differs_from_the_tiny_preset(parts):
    from omni_qwen3_omni.loading import read_config
    from omni_qwen3_omni.source import resolve_model_path

    ref, tiny = parts["config"], read_config(resolve_model_path("tiny").path)
    for get in (
        lambda c: c.text.hidden_size,
        lambda c: c.text.num_hidden_layers,
        lambda c: c.text.num_experts,
        lambda c: c.text.num_experts_per_tok,
        lambda c: c.audio.d_model,
        lambda c: c.vision.hidden_size,
        lambda c: c.vision.depth,
    ):
        assert get(ref) != get(tiny)


# -- 2. preprocessing ---------------------------------------------------------------


@pytest.mark.parametrize("name", CASES)
def test_prompt_ids_match_reference_processor(reference, name):
    ckpt, manifest = reference
    case = case_entry(manifest, name)
    prompter = ChatPrompter.from_dir(ckpt)  # tokenizer.json + chat_template.jinja as saved
    messages = case["messages"]
    assert prompter.render(messages) == case["prompt"]
    # Our own per-medium counts agree with the processor's.
    assert [image_token_count(g) for g in case["image_grid_thw"]] == case["image_token_counts"]
    assert [audio_token_count(n) for n in case["audio_mel_frames"]] == case["audio_token_counts"]
    ids = prompter.encode(messages, case["image_token_counts"], case["audio_token_counts"])
    assert ids == case["input_ids"]
    assert len(case["generated_ids"]) == MAX_NEW or case["stopped_on_eos"]


@pytest.mark.parametrize("name", CASES)
def test_preprocessing_stage_matches_reference_processor(reference, ours, name):
    _, manifest = reference
    case, ref = case_entry(manifest, name), case_tensors(manifest, name)
    pre = ours[name]["pre"]
    prompt = pre["prompt"]
    assert prompt["token_ids"] == case["input_ids"]
    assert torch.equal(torch.as_tensor(prompt["positions"]), ref["position_ids"])
    assert prompt["next_position"] == len(case["input_ids"]) + int(ref["rope_deltas"][0])
    assert [im["grid_thw"] for im in pre["images"]] == case["image_grid_thw"]
    if case["images"]:
        pixels = torch.cat([im["pixel_values"] for im in pre["images"]])
        diff = float((pixels.float() - ref["pixel_values"]).abs().max())
        print(f"{name}: pixel_values max |diff| {diff:.2e}")
        assert diff <= 1e-6
    else:
        assert "pixel_values" not in ref
    assert [int(m.shape[-1]) for m in pre["audios"]] == case["audio_mel_frames"]
    if case["audios"]:
        mel = torch.cat(list(pre["audios"]), dim=1)
        diff = float((mel.float() - ref["input_features"]).abs().max())
        print(f"{name}: mel max |diff| {diff:.2e}")
        assert diff <= 1e-5
    else:
        assert "input_features" not in ref
    assert pre["sampling"]["temperature"] == 0.0
    assert pre["sampling"]["max_new_tokens"] == MAX_NEW


# -- 3. encoders --------------------------------------------------------------------


@pytest.mark.parametrize("name", ["image", "two_images", "image_audio"])
def test_vision_encoder_matches_reference(reference, ours, name):
    _, manifest = reference
    ref = case_tensors(manifest, name)
    got = ours[name]["encoders"]["image_encoder"]
    errors = {"embeds": rel_l2(got["embeds"], ref["image_embeds"])}
    expected = sorted(k for k in ref if k.startswith("deepstack_"))
    assert len(got["deepstack"]) == len(expected)
    for k, feature in enumerate(got["deepstack"]):
        errors[f"deepstack_{k}"] = rel_l2(feature, ref[f"deepstack_{k}"])
    print(f"{name}: vision rel L2 " + ", ".join(f"{k} {v:.2e}" for k, v in errors.items()))
    assert max(errors.values()) <= REL_L2, errors


@pytest.mark.parametrize("name", ["audio", "image_audio"])
def test_audio_encoder_matches_reference(reference, ours, name):
    _, manifest = reference
    ref = case_tensors(manifest, name)
    error = rel_l2(ours[name]["encoders"]["audio_encoder"]["embeds"], ref["audio_embeds"])
    print(f"{name}: audio rel L2 {error:.2e}")
    assert error <= REL_L2


# -- 4. thinker ---------------------------------------------------------------------


def _forward(lm: Any, prompt: EmbeddedPrompt, layers: int):
    """One full-prompt forward as the reference's ``thinker(...)`` runs it: (hidden, captures)."""
    ids = torch.tensor(prompt.token_ids, dtype=torch.long)
    x = splice_embeddings(lm.embed(ids), prompt)[None]
    positions = prompt.positions[:, None, :]
    deepstack = None
    if prompt.layer_additions:
        deepstack = [(prompt.addition_index, rows) for rows in prompt.layer_additions]
    return lm(x, positions, deepstack=deepstack, capture_layers=range(layers + 1))


@pytest.mark.parametrize("name", CASES)
def test_thinker_hidden_states_match_reference(reference, parts, ours, name):
    _, manifest = reference
    ref = case_tensors(manifest, name)
    lm = parts["modules"]["thinker"]
    layers = parts["config"].text.num_hidden_layers
    expected = ref["thinker_hidden_states"]
    assert expected.shape[0] == layers + 1
    with torch.inference_mode():
        final, captured = _forward(lm, ours[name]["prompt"], layers)
        logits = lm.logits(final[0, -1])
    errors = {k: rel_l2(captured[k][0], expected[k]) for k in range(layers + 1)}
    errors["final"] = rel_l2(final[0], expected[-1])
    errors["last_logits"] = rel_l2(logits, ref["thinker_last_logits"])
    print(f"{name}: thinker rel L2 " + ", ".join(f"{k} {v:.2e}" for k, v in errors.items()))
    assert max(errors.values()) <= REL_L2, errors


def _check_tokens(manifest: dict, name: str, got: list[int]) -> None:
    case = case_entry(manifest, name)
    want = case["generated_ids"]
    at = first_difference(got, want)
    if at is not None:
        margins = case_tensors(manifest, name)["generated_margins"]
        margin = float(margins[at]) if at < len(margins) else float("nan")
        pytest.fail(
            f"{name}: greedy tokens differ first at step {at} (reference top-1/top-2 margin "
            f"there {margin:.3g}; min over the run {case['min_margin']:.3g})\n"
            f"ours {got}\nref  {want}"
        )
    assert len(want) == MAX_NEW or case["stopped_on_eos"]


@pytest.mark.parametrize("name", CASES)
def test_greedy_tokens_match_referencegreedy(reference, parts, ours, name):
    _, manifest = reference
    got = greedy(parts, {name: ours[name]["prompt"]})[name]
    _check_tokens(manifest, name, got)


def test_concurrent_greedy_tokens_match_referencegreedy(reference, parts, ours):
    """All five cases on one engine at once (four slots: the fifth joins mid-decode)."""
    _, manifest = reference
    got = greedy(parts, {name: ours[name]["prompt"] for name in CASES})
    for name in CASES:
        _check_tokens(manifest, name, got[name])
