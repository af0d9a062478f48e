"""Small media files for the pipeline tests, made here (no fixtures on disk)."""

from __future__ import annotations

import base64
import io

import numpy as np


def png_bytes(height: int, width: int, seed: int = 0) -> bytes:
    from PIL import Image

    pixels = (np.random.default_rng(seed).random((height, width, 3)) * 255).astype(np.uint8)
    out = io.BytesIO()
    Image.fromarray(pixels).save(out, format="PNG")
    return out.getvalue()


def wav_bytes(seconds: float, rate: int = 16000, pitch: float = 440.0) -> bytes:
    import soundfile

    t = np.arange(int(seconds * rate)) / rate
    out = io.BytesIO()
    soundfile.write(
        out, (0.3 * np.sin(2 * np.pi * pitch * t)).astype(np.float32), rate, format="WAV"
    )
    return out.getvalue()


def image_part(height: int = 64, width: int = 96, seed: int = 0) -> dict:
    data = base64.b64encode(png_bytes(height, width, seed)).decode()
    return {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{data}"}}


def audio_part(seconds: float = 1.5, pitch: float = 440.0) -> dict:
    data = base64.b64encode(wav_bytes(seconds, pitch=pitch)).decode()
    return {"type": "input_audio", "input_audio": {"data": data, "format": "wav"}}


def user(*parts: dict, text: str = "Describe it.") -> list[dict]:
    return [{"role": "user", "content": [*parts, {"type": "text", "text": text}]}]


def speech_samples(text: str = "hello there", rate: int = 16000) -> np.ndarray | None:
    """``text`` said by espeak-ng as float32 mono at ``rate``; None without espeak-ng."""
    import shutil
    import subprocess
    import tempfile

    import soundfile

    espeak = shutil.which("espeak-ng")
    if espeak is None:
        return None
    with tempfile.TemporaryDirectory() as tmp:
        path = f"{tmp}/speech.wav"
        subprocess.run([espeak, "-w", path, text], check=True, timeout=30)
        samples, native = soundfile.read(path, dtype="float32")
    if native != rate:
        import soxr

        samples = soxr.resample(samples, native, rate).astype(np.float32)
    return samples


def mp4_bytes(
    seconds: float = 2.0,
    width: int = 96,
    height: int = 64,
    fps: int = 10,
    sound: np.ndarray | None = None,
    sound_rate: int = 16000,
) -> bytes:
    """An H.264 MP4 with a bright square moving across stripes; ``sound`` as an AAC track."""
    import fractions

    import av

    out = io.BytesIO()
    frames = round(seconds * fps)
    with av.open(out, "w", format="mp4") as container:
        video = container.add_stream("libx264", rate=fps)
        video.width, video.height, video.pix_fmt = width, height, "yuv420p"
        video.time_base = fractions.Fraction(1, fps)
        audio = None
        if sound is not None:
            audio = container.add_stream("aac", rate=sound_rate, layout="mono")
        ys, xs = np.mgrid[0:height, 0:width]
        for k in range(frames):
            pixels = np.zeros((height, width, 3), dtype=np.uint8)
            pixels[..., 0] = (xs * 255 // max(width - 1, 1)).astype(np.uint8)
            pixels[..., 1] = ((ys // 4) % 2 * 120 + 40).astype(np.uint8)
            left = (k * (width - 16)) // max(frames - 1, 1)
            pixels[height // 4 : height // 4 + 16, left : left + 16] = (255, 255, 60)
            frame = av.VideoFrame.from_ndarray(pixels, format="rgb24")
            frame.pts = k
            for packet in video.encode(frame):
                container.mux(packet)
        for packet in video.encode():
            container.mux(packet)
        if audio is not None:
            samples = np.ascontiguousarray(sound, dtype=np.float32)[None]
            for start in range(0, samples.shape[1], 1024):
                block = av.AudioFrame.from_ndarray(
                    np.ascontiguousarray(samples[:, start : start + 1024]),
                    format="flt",
                    layout="mono",
                )
                block.sample_rate, block.pts = sound_rate, start
                for packet in audio.encode(block):
                    container.mux(packet)
            for packet in audio.encode():
                container.mux(packet)
    return out.getvalue()


def video_part(raw: bytes) -> dict:
    data = base64.b64encode(raw).decode()
    return {"type": "video_url", "video_url": {"url": f"data:video/mp4;base64,{data}"}}
