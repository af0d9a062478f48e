"""Qwen3-Omni's code2wav: talker codes (16 per frame) -> 24 kHz audio (1920 samples per frame).

``config`` parses ``code2wav_config``; ``model`` holds :class:`~.model.Code2Wav`,
which is Qwen3-TTS's codec decoder (``omni_qwen3_tts.speech_tokenizer``)
with Qwen3-Omni's code embedding in front. Kept import-light: nothing is
imported here, so planning code can reach the package without loading torch.
"""
