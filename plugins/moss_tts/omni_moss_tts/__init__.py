"""MOSS-TTS for omni: the pipeline declaration and its stages."""

__version__ = "0.1.0"
