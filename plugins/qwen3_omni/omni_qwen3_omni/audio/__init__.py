"""Qwen3-Omni's audio path: the log-mel front end (``mel``) and the audio tower (``encoder``).

Kept import-light on purpose: ``mel.audio_token_count`` is needed by prompt
building, which must not pay for torch or the model code. Import the
submodules directly.
"""
