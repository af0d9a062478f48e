"""Write a deterministic 24 kHz mono test clip (voice-like tones, no speech engine needed).

Usage::

    python make_clip.py OUT.wav [--seconds 2.0] [--sample-rate 24000] [--seed 0]

Standard library + numpy + soundfile only, so both omni's environment and the
MOSS-TTS reference environment can run it. The signal is a few harmonics of a
gliding fundamental (110-190 Hz, with vibrato) under a syllable-like amplitude
envelope, plus a little seeded noise; it is written as 16-bit PCM, so the
samples a reader gets back are exact and identical on every machine (numpy's
legacy ``RandomState`` stream is frozen across numpy versions).
"""

from __future__ import annotations

import argparse
import math
from pathlib import Path

import numpy as np
import soundfile as sf


def make_clip(seconds: float = 2.0, sample_rate: int = 24000, seed: int = 0) -> np.ndarray:
    """The clip as float32 in [-1, 1], already quantised to 16-bit steps."""
    n = round(seconds * sample_rate)
    t = np.arange(n, dtype=np.float64) / sample_rate
    rng = np.random.RandomState(seed)
    # fundamental gliding up then down, with a 5.5 Hz vibrato
    f0 = (
        150.0
        + 40.0 * np.sin(2.0 * math.pi * t / max(seconds, 1e-3))
        + 3.0 * np.sin(2.0 * math.pi * 5.5 * t)
    )
    phase = 2.0 * math.pi * np.cumsum(f0) / sample_rate
    voice = np.zeros(n)
    for k, amp in enumerate((1.0, 0.55, 0.35, 0.22, 0.12), start=1):
        voice += amp * np.sin(k * phase + 0.3 * k)
    # ~4 "syllables" per second, with short gaps
    syllables = np.clip(np.sin(2.0 * math.pi * 2.0 * t) ** 2 * 1.4 - 0.2, 0.0, 1.0)
    fade = np.minimum(1.0, np.minimum(t, t[-1] - t) / 0.02)
    signal = 0.25 * voice * syllables * fade + 0.01 * rng.standard_normal(n)
    pcm = np.clip(np.round(signal * 32767.0), -32768, 32767).astype(np.int16)
    return (pcm.astype(np.float32) / 32768.0).astype(np.float32)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--seconds", type=float, default=2.0)
    parser.add_argument("--sample-rate", type=int, default=24000)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    clip = make_clip(args.seconds, args.sample_rate, args.seed)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    sf.write(str(args.out), clip, args.sample_rate, subtype="PCM_16")


if __name__ == "__main__":
    main()
