"""Media that arrives from outside: uploaded audio and media references, read under bounds.

Everything here treats its input as hostile (see the "Trust" section of the
design): sizes, durations and addresses are checked before anything is
decoded or fetched. Nothing heavy is imported at module level; numpy and
soundfile load on first use, inside the stage processes that decode audio.
"""

from .audio_input import AudioLimits, DecodedAudio, decode_audio, decode_base64_audio
from .errors import MediaError

__all__ = ["AudioLimits", "DecodedAudio", "MediaError", "decode_audio", "decode_base64_audio"]
