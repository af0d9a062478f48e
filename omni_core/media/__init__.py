"""Media from outside (audio, images, video, references), read under bounds.

Everything here treats its input as hostile (see the "Trust" section of the
design): sizes, durations and addresses are checked before anything is
decoded or fetched. Nothing heavy is imported at module level; numpy,
soundfile, Pillow and PyAV load on first use, inside the stage processes that
decode media.
"""

from .audio_input import AudioLimits, DecodedAudio, decode_audio, decode_base64_audio, probe_audio
from .errors import MediaError
from .image_input import ImageLimits, decode_base64_image, decode_image, probe_image
from .sources import MediaFetch, read_base64, read_media, read_media_sync
from .video_input import (
    VideoInfo,
    VideoLimits,
    decode_video_audio,
    decode_video_frames,
    probe_video,
)

__all__ = [
    "AudioLimits",
    "DecodedAudio",
    "ImageLimits",
    "MediaError",
    "MediaFetch",
    "VideoInfo",
    "VideoLimits",
    "decode_audio",
    "decode_base64_audio",
    "decode_base64_image",
    "decode_image",
    "decode_video_audio",
    "decode_video_frames",
    "probe_audio",
    "probe_image",
    "probe_video",
    "read_base64",
    "read_media",
    "read_media_sync",
]
