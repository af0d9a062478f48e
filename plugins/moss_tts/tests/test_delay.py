"""The delay pattern and the generation state machine, against hand-worked layouts."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from omni_moss_tts.config import MossTTSConfig  # noqa: E402
from omni_moss_tts.delay import DelayTracker, apply_delay, undelay  # noqa: E402
from omni_qwen3_tts.config import TransformerConfig  # noqa: E402

PAD = 1024


def config(n_vq: int = 4) -> MossTTSConfig:
    backbone = TransformerConfig(
        vocab_size=151936,
        hidden_size=8,
        intermediate_size=16,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=4,
    )
    return MossTTSConfig(backbone=backbone, n_vq=n_vq)


@pytest.mark.parametrize(("frames", "books"), [(1, 1), (1, 32), (5, 3), (40, 32), (0, 4)])
def test_undelay_inverts_delay_on_random_codes(frames: int, books: int) -> None:
    codes = torch.randint(0, 1024, (frames, books), generator=torch.Generator().manual_seed(frames))
    delayed = apply_delay(codes, PAD)
    assert delayed.shape == (frames + books - 1, books)
    assert torch.equal(undelay(delayed), codes)


def test_codebook_k_sits_k_rows_late_with_pad_around() -> None:
    codes = torch.arange(6).reshape(3, 2) + 10  # frames 0..2, books 0..1
    assert apply_delay(codes, PAD).tolist() == [[10, PAD], [12, 11], [14, 13], [PAD, 15]]


def run_segment(tracker: DelayTracker, cfg: MossTTSConfig, stop_after: int, rows: list):
    """Drive a tracker like the model would: audio start, gen slots, a delay slot, the drain."""
    frames, texts = [], []
    for _ in range(200):
        rule = tracker.text_rule()
        if rule.forced is not None:
            text = rule.forced
        elif not tracker.in_audio:
            text = cfg.audio_start_token_id
        elif tracker.frames < stop_after:
            text = cfg.audio_assistant_gen_slot_token_id
        else:
            text = cfg.audio_assistant_delay_slot_token_id
        books = tracker.sampled_books()
        codes = [PAD] * cfg.n_vq
        for k in books:
            codes[k] = 100 * len(texts) + k  # unique per step and book
        rows.append([text, *codes])
        texts.append(text)
        frames += tracker.advance(text, codes)
        if text == cfg.audio_end_token_id:
            break
    return frames, texts


def test_a_segment_completes_every_frame_equal_to_undelaying_its_rows() -> None:
    cfg = config(n_vq=4)
    tracker = DelayTracker(cfg, frame_cap=100)
    rows: list = []
    frames, texts = run_segment(tracker, cfg, stop_after=5, rows=rows)
    # audio start, 5 gen slots... the 6th step's delay slot carries frame 5's codebook 0
    assert texts[0] == cfg.audio_start_token_id
    assert texts.count(cfg.audio_assistant_delay_slot_token_id) == 1 + (cfg.n_vq - 1)
    assert texts[-1] == cfg.audio_end_token_id
    segment = torch.tensor(rows)[1:-1, 1:]  # between audio start and audio end
    expected = undelay(segment)
    assert [index for index, _ in frames] == list(range(expected.shape[0]))
    assert torch.tensor([codes for _, codes in frames]).tolist() == expected.tolist()
    assert not tracker.in_audio and tracker.audio_length == 0 and tracker.drain is None


def test_rules_follow_the_release_outside_inside_and_in_the_drain() -> None:
    cfg = config(n_vq=3)
    tracker = DelayTracker(cfg, frame_cap=100)
    first = tracker.text_rule()
    assert first.forced is None and first.allowed is None
    assert cfg.audio_assistant_delay_slot_token_id in first.banned  # step 0
    assert cfg.im_end_token_id in first.banned  # steps <= n_vq
    assert cfg.pad_token_id in first.banned and cfg.audio_end_token_id in first.banned
    tracker.advance(cfg.audio_start_token_id, [PAD] * 3)
    inside = tracker.text_rule()
    assert inside.allowed == (
        cfg.audio_assistant_gen_slot_token_id,
        cfg.audio_assistant_delay_slot_token_id,
    )
    assert list(tracker.sampled_books()) == [0]
    tracker.advance(cfg.audio_assistant_delay_slot_token_id, [1, PAD, PAD])
    assert tracker.drain == 1
    assert tracker.text_rule().forced == cfg.audio_assistant_delay_slot_token_id
    assert list(tracker.sampled_books()) == [1]  # codebook 0 is over; 1 is due
    tracker.advance(cfg.audio_assistant_delay_slot_token_id, [PAD, 2, PAD])
    assert list(tracker.sampled_books()) == [2]
    tracker.advance(cfg.audio_assistant_delay_slot_token_id, [PAD, PAD, 3])
    assert tracker.text_rule().forced == cfg.audio_end_token_id
    assert list(tracker.sampled_books()) == []


def test_the_frame_cap_forces_the_delay_slot_so_capped_audio_ends_whole() -> None:
    cfg = config(n_vq=4)
    tracker = DelayTracker(cfg, frame_cap=3)
    rows: list = []
    frames, texts = run_segment(tracker, cfg, stop_after=10**6, rows=rows)
    assert len(frames) == 3
    assert all(PAD not in codes for _, codes in frames)
    assert texts[-1] == cfg.audio_end_token_id


def test_a_continuation_prompt_resumes_inside_its_segment() -> None:
    cfg = config(n_vq=4)
    reference = torch.randint(0, 1024, (6, 4), generator=torch.Generator().manual_seed(3))
    delayed = apply_delay(reference, PAD)[:6]  # the release cuts after the last frame
    text = [7, cfg.im_start_token_id, cfg.audio_start_token_id] + [
        cfg.audio_assistant_gen_slot_token_id
    ] * 6
    codes = torch.cat([torch.full((3, 4), PAD), delayed])
    prompt = torch.cat([torch.tensor(text)[:, None], codes], dim=1)
    tracker = DelayTracker.after_prompt(cfg, prompt, frame_cap=2)
    assert tracker.in_audio and tracker.audio_length == 7 and tracker.prefix_frames == 6
    early = tracker.complete_prefix(prompt[3:, 1:])
    assert torch.equal(early, reference[:3])  # frames 0..2 are whole inside the prompt
    assert list(tracker.sampled_books()) == [0, 1, 2, 3]
    done = tracker.advance(cfg.audio_assistant_gen_slot_token_id, [50, 51, 52, 53])
    # codebook 3 of frame 3 arrived: frame 3 is the prompt's codes 0..2 plus the new one
    assert done == [(3, [*reference[3, :3].tolist(), 53])]
    assert tracker.new_frames == 1
    # the cap counts new frames only: the next step's codebook 0 is the second and last
    assert tracker.text_rule().forced == cfg.audio_assistant_delay_slot_token_id
