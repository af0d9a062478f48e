"""The chat API: ``POST /v1/chat/completions``, the content parts a message may hold, and
the media references they may point at."""
