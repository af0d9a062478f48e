"""The speech API: ``POST /v1/audio/speech`` (whole, SSE or chunked), its batch form, and
the WebSocket that speaks text while it is written (with its sentence segmenter)."""
