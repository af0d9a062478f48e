"""omni-qwen3-asr: Qwen3-ASR (speech in, text out) on omni, built from parts omni already has.

Pipeline ``qwen3-asr``: ``preprocessing`` (the clip decoded and resampled to
16 kHz, the Whisper-style log-mel, the release's prompt) -> ``asr`` (the audio
tower, then the dense Qwen3 decoder on the torch engine, continuously
batched) -> ``decode`` (incremental detokenisation; the ``language X<asr_text>``
header the model writes is read off, never sent as text). The three stages
share one process, as the seed's single ``asr`` stage suggests; the encoder
and the decoder share a stage, so the tower's rows reach the decoder as
tensors in memory.

What is reused, and from where (decision, and why): Qwen3-ASR's parts are
Qwen3-Omni's, part for part, at other sizes -- the 128-bin log-mel
(``omni_qwen3_omni.audio.mel``), the audio tower with its chunked convs and
windowed attention (``omni_qwen3_omni.audio.encoder``), the thinker's decoder
(``omni_qwen3_omni.thinker.decoder``; with no experts every layer's
feed-forward is the dense SwiGLU, the names Qwen3-ASR's checkpoint uses) and
its engine step model (``thinker.step``), the chat-template renderer
(``chat``). We depend on
``omni-qwen3-omni`` for them rather than move them: they are model code the
two families share, which the speech kit (``omni_core.kit``) deliberately
does not hold (the core knows no model), and Qwen3-Omni already depends on
``omni-qwen3-tts`` for its decoder layers the same way. The plugin-shaped
boilerplate comes from ``omni_core.kit``: model-source checks, the stage
chain, hook registration, config parsing (``known_fields``) and strict
safetensors loading by prefix (``kit.weights.Checkpoint``); the dtype rule is
the core's (``engine.precision``). What is Qwen3-ASR's own lives here: the config's nesting,
the prompt (context as the system turn, a forced language as the start of
the answer), the output's language header, and the languages it knows.
"""
