"""``/v1/realtime``: the OpenAI Realtime API over a running pipeline (voice agents).

A session is a client of the same stage graph as every other route: each
response is one chat request admitted through :meth:`..service.Service.admit`
(the conversation so far as its messages, the user's audio as audio), and
cancelling it aborts that request in every process. Rooms: ``config`` (the
session's settings, GA and beta spellings), ``formats`` (the audio formats
in and out), ``vad`` (server-side turn detection), ``conversation`` (items and
the history they make), ``events`` (the server events' shapes), ``session``
(one connection), ``routes`` (the endpoint).
"""
