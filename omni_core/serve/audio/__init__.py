"""Audio out: PCM16 and the wire formats (``pcm``), every format's encoder (``encoders``),
and how a client playing the stream would hear it (``playback``, for metrics)."""
