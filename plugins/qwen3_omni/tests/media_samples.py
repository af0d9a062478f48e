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
