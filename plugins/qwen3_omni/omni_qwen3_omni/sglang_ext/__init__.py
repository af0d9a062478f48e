"""The Qwen3-Omni thinker's decoder as an SGLang model, fed by omni's encoders.

SGLang imports this package in its own processes (never in omni's parent):
``SGLANG_EXTERNAL_MODEL_PACKAGE`` registers :mod:`.thinker_model`'s class,
``SGLANG_EXTERNAL_MM_PROCESSOR_PACKAGE`` :mod:`.thinker_processor`'s. Every
module here is imported by both scans, so the package holds nothing else.

Why our own class rather than SGLang's ``Qwen3OmniMoeForConditionalGeneration``:
omni runs the audio and vision towers in stages of their own (their own
processes, batching and budgets), so the decoder receives finished embedding
rows, not pixels and mel frames; and the talker reads two hidden states of
every position (the layer-0 input and the ``accept_hidden_layer`` output),
which SGLang's class does not expose. The decoder itself is SGLang's
(``Qwen3MoeLLMModel``: its attention backends, paged KV pool, fused MoE,
M-RoPE and deepstack), so everything SGLang does for speed applies.
"""
