"""``POST /v1/audio/transcriptions`` and ``/v1/audio/translations``: audio in, text out.

One room, one concept per module: the multipart form and its checks
(``form``), the uploaded file made into audio a pipeline reads (``audio``),
the request a listening pipeline receives (``request``), the answer in each
``response_format`` (``formats``) and the routes that tie them together
(``routes``).
"""
