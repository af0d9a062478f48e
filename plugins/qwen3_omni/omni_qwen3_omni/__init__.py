"""Qwen3-Omni for omni: speech, colocated-speech and text pipelines."""

__version__ = "0.1.0"
