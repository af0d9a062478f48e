"""Voices: which names a request may use, ``/v1/audio/voices`` (routes), and uploaded
voices on disk (store, over the link-refusing file operations of ``files``)."""
