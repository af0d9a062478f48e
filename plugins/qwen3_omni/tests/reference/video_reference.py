"""Record how the release reads a video and what transformers makes of it.

Runs inside the reference environment (transformers 4.57.3 and
``qwen-omni-utils`` 0.0.9), never inside omni's. Usage::

    python video_reference.py OUT_DIR REQUEST.json

The checkpoint is the one ``speech_reference.py`` writes (thinker, talker
and code2wav, seeded, saved with ``save_pretrained``; that script is run
with no cases). Each case then goes the release's cookbook way:
``processor.apply_chat_template``, ``qwen_omni_utils.process_mm_info(...,
use_audio_in_video=...)`` (its default ``image_patch_size`` of 14),
``processor(text, audio, images, videos, use_audio_in_video=...)`` and
``generate(**inputs, use_audio_in_video=...)``, greedy.

Two readers are swapped for PyAV-backed ones, because this environment has
neither of the programs behind them:

- ``torchvision.io.read_video`` (qwen-omni-utils' "torchvision" backend; the
  function is gone from torchvision 0.28, and decord/torchcodec are not
  installed): written to what torchvision's PyAV reader returned: every frame
  of the first video stream decoded to RGB (``frame.to_ndarray("rgb24")``),
  ``TCHW`` uint8, and ``video_fps`` the stream's average rate;
- ``audioread.ffdec.FFmpegAudioFile`` (the sound track, read by ``librosa``;
  the ``ffmpeg`` binary is not installed): the first audio stream decoded and
  converted to interleaved 16-bit PCM at its own rate and channel count, what
  ``ffmpeg -f s16le`` hands audioread.

Request (JSON)::

    {"thinker_max_new_tokens": 32, "speech_thinker_tokens": 12,
     "talker_max_new_tokens": 31, "seed": 3,
     "cases": [{"name": str, "speaker": str | null, "use_audio_in_video": bool,
                "messages": [...]}]}

Messages in the qwen-omni-utils form, media by absolute path:
``{"type": "video", "video": PATH}``, ``{"type": "image", "image": PATH}``.
A case with a ``speaker`` is spoken (``return_audio=True``, the talker and
its code predictor greedy, as ``speech_reference.py`` forces it).

Output (``OUT_DIR``): ``ckpt/`` and, in ``ref/``, ``manifest.json``
(versions; per case: name, prompt, input_ids, generated_ids,
frames_indices per video, video_second_per_grid, min margin, frames) and
``CASE.safetensors``: input_ids, position_ids [3, T], rope_deltas,
pixel_values_videos, video_grid_thw, video_embeds, video_deepstack_K,
pixel_values / image_grid_thw (with an image), input_features (valid
frames, with audio), generated_ids, generated_margins; spoken: codes [F, G],
code0_margins, predictor_margins, wav (the unchunked code2wav forward).
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import json
import os
import sys
import types
from pathlib import Path

import numpy as np
import torch

torch.set_num_threads(1)
os.environ["FORCE_QWENVL_VIDEO_READER"] = "torchvision"
sys.modules.setdefault("torchvision._meta_registrations", types.ModuleType("_stub"))

import av  # noqa: E402
import torchvision  # noqa: E402

HERE = Path(__file__).resolve().parent


def _load(name: str):
    spec = importlib.util.spec_from_file_location(f"omni_ref_{name}", HERE / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def read_video(path, start_pts=0.0, end_pts=None, pts_unit="sec", output_format="TCHW"):
    """torchvision's PyAV ``read_video`` as qwen-omni-utils calls it (whole clip, TCHW)."""
    assert start_pts == 0.0 and end_pts is None and output_format == "TCHW"
    path = path[len("file://") :] if path.startswith("file://") else path
    with av.open(path) as container:
        stream = container.streams.video[0]
        frames = [f.to_ndarray(format="rgb24") for f in container.decode(stream)]
        fps = float(stream.average_rate)
    video = torch.from_numpy(np.stack(frames)).permute(0, 3, 1, 2).contiguous()
    return video, torch.empty(1, 0), {"video_fps": fps}


class PyAVAudioFile:
    """audioread's FFmpegAudioFile interface over PyAV: interleaved s16 blocks."""

    def __init__(self, path: str):
        self.path = path
        with av.open(path) as container:
            stream = container.streams.audio[0]
            self.samplerate = int(stream.codec_context.sample_rate)
            self.channels = int(stream.codec_context.layout.nb_channels)
            self.duration = float(stream.duration * stream.time_base)

    def __iter__(self):
        with av.open(self.path) as container:
            stream = container.streams.audio[0]
            resampler = av.AudioResampler(format="s16", layout=stream.layout, rate=self.samplerate)
            for frame in container.decode(stream):
                for out in resampler.resample(frame):
                    yield out.to_ndarray().tobytes()
            for out in resampler.resample(None):
                yield out.to_ndarray().tobytes()

    def close(self) -> None:
        pass

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()


torchvision.io.read_video = read_video
import audioread  # noqa: E402
import audioread.ffdec  # noqa: E402

audioread.ffdec.FFmpegAudioFile = PyAVAudioFile
audioread.available_backends = lambda flush_cache=False: (PyAVAudioFile,)

from qwen_omni_utils import process_mm_info  # noqa: E402
from qwen_omni_utils.v2_5.vision_process import fetch_video  # noqa: E402
from safetensors.torch import save_file  # noqa: E402
from transformers import (  # noqa: E402
    Qwen3OmniMoeForConditionalGeneration,
    Qwen3OmniMoeProcessor,
)


def margins(scores) -> torch.Tensor:
    top = torch.stack([s[0].float().topk(2).values for s in scores])
    return top[:, 0] - top[:, 1]


def main() -> None:
    out, request_path = Path(sys.argv[1]), Path(sys.argv[2])
    request = json.loads(request_path.read_text())
    seed = int(request.get("seed", 3))
    thinker_tokens = int(request.get("thinker_max_new_tokens", 32))
    speech_tokens = int(request.get("speech_thinker_tokens", 12))
    talker_tokens = int(request.get("talker_max_new_tokens", 31))

    sr = _load("speech_reference")
    empty = out / "speech_request.json"
    empty.write_text(json.dumps({"seed": seed, "cases": []}))
    argv, sys.argv = sys.argv, [sys.argv[0], str(out), str(empty)]
    try:
        sr.main()
    finally:
        sys.argv = argv
    ckpt, ref = out / "ckpt", out / "ref"

    processor = Qwen3OmniMoeProcessor.from_pretrained(ckpt)
    model = Qwen3OmniMoeForConditionalGeneration.from_pretrained(
        ckpt, dtype=torch.float32, attn_implementation="sdpa"
    ).eval()
    thinker = model.thinker

    record: dict = {}
    predictor = model.talker.code_predictor
    predictor_generate = predictor.generate

    def greedy_predictor(*args, **kwargs):
        kwargs.update(do_sample=False, top_k=None, top_p=None, output_scores=True)
        kwargs["return_dict_in_generate"] = True
        result = predictor_generate(*args, **kwargs)
        record["predictor_margins"].append(margins(result.scores))
        return result

    predictor.generate = greedy_predictor
    talker_generate = model.talker.generate

    def talker_recorded(*args, **kwargs):
        kwargs["output_scores"] = True
        result = talker_generate(*args, **kwargs)
        record["code0_margins"] = margins(result.scores)
        return result

    model.talker.generate = talker_recorded
    chunked_decode = model.code2wav.chunked_decode

    def decode_recorded(codes, **kwargs):
        record["codes"] = codes[0].t().clone()
        record["wav"] = model.code2wav(codes)[0, 0].clone()
        return chunked_decode(codes, **kwargs)

    model.code2wav.chunked_decode = decode_recorded

    entries = []
    for case in request["cases"]:
        name, messages = case["name"], case["messages"]
        flag, speaker = bool(case["use_audio_in_video"]), case.get("speaker")
        videos_in = [p for m in messages for p in m["content"] if p.get("type") == "video"]
        indices = []
        for part in videos_in:
            (_, metadata), _ = fetch_video(
                dict(part), return_video_sample_fps=True, return_video_metadata=True
            )
            indices.append([int(i) for i in torch.as_tensor(metadata["frames_indices"])])
        text = processor.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        audios, images, videos = process_mm_info(messages, use_audio_in_video=flag)
        inputs = processor(
            text=text,
            audio=audios,
            images=images,
            videos=videos,
            return_tensors="pt",
            padding=True,
            use_audio_in_video=flag,
        )
        tensors: dict[str, torch.Tensor] = {"input_ids": inputs["input_ids"][0]}
        with torch.no_grad():
            grid = inputs["video_grid_thw"]
            embeds, deepstack = thinker.get_video_features(inputs["pixel_values_videos"], grid)
            tensors.update(
                pixel_values_videos=inputs["pixel_values_videos"],
                video_grid_thw=grid,
                video_embeds=embeds,
            )
            for k, extra in enumerate(deepstack):
                tensors[f"video_deepstack_{k}"] = extra
            if "pixel_values" in inputs:
                tensors.update(
                    pixel_values=inputs["pixel_values"], image_grid_thw=inputs["image_grid_thw"]
                )
            seqlens = None
            if "input_features" in inputs:
                mask = inputs["feature_attention_mask"]
                seqlens = mask.sum(-1)
                valid = inputs["input_features"].permute(0, 2, 1)[mask.bool()]
                tensors["input_features"] = valid.T
            position_ids, rope_deltas = thinker.get_rope_index(
                inputs["input_ids"],
                inputs.get("image_grid_thw"),
                grid,
                inputs["attention_mask"],
                flag,
                seqlens,
                torch.as_tensor(inputs["video_second_per_grid"]),
            )
            tensors["position_ids"] = position_ids[:, 0]
            tensors["rope_deltas"] = rope_deltas.reshape(-1)

            thinker.rope_deltas = None
            model.talker.rope_deltas = None
            record.clear()
            record["predictor_margins"] = []
            spoken = speaker is not None
            try:
                result, _ = model.generate(
                    **inputs,
                    use_audio_in_video=flag,
                    speaker=speaker or "ethan",
                    return_audio=spoken,
                    thinker_max_new_tokens=speech_tokens if spoken else thinker_tokens,
                    thinker_do_sample=False,
                    thinker_return_dict_in_generate=True,
                    thinker_output_scores=True,
                    talker_do_sample=False,
                    talker_max_new_tokens=talker_tokens,
                )
            except RuntimeError as exc:  # see REFERENCE.md: image + video in one prompt
                result, error = None, str(exc).splitlines()[0]
        entry = {
            "name": name,
            "use_audio_in_video": flag,
            "speaker": speaker,
            "prompt": text,
            "input_ids": inputs["input_ids"][0].tolist(),
            "frames_indices": indices,
            "video_second_per_grid": [float(s) for s in inputs["video_second_per_grid"]],
        }
        if result is None:
            entry["generate_error"] = error
        else:
            generated = result.sequences[0, inputs["input_ids"].shape[1] :]
            tensors["generated_ids"] = generated
            tensors["generated_margins"] = margins(result.scores)
            entry["generated_ids"] = generated.tolist()
            entry["min_margin"] = float(tensors["generated_margins"].min())
        if spoken and result is not None:
            tensors.update(
                codes=record["codes"].long(),
                code0_margins=record["code0_margins"],
                predictor_margins=torch.stack(record["predictor_margins"]),
                wav=record["wav"].float(),
            )
            entry["frames"] = int(record["codes"].shape[0])
            entry["text"] = processor.tokenizer.decode(generated, skip_special_tokens=True)
        integer = {"input_ids", "generated_ids", "position_ids", "rope_deltas", "codes"}
        integer |= {"video_grid_thw", "image_grid_thw"}
        save_file(
            {
                k: v.detach().to(torch.int64 if k in integer else torch.float32).contiguous()
                for k, v in tensors.items()
            },
            str(ref / f"{name}.safetensors"),
        )
        entries.append(entry)

    import transformers

    manifest = {
        "transformers_version": transformers.__version__,
        "qwen_omni_utils": importlib.metadata.version("qwen-omni-utils"),
        "checkpoint": "ckpt",
        "cases": entries,
    }
    (ref / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n")


if __name__ == "__main__":
    main()
