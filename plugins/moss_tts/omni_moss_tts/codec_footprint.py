"""What the MOSS codec's streams and chunks hold on the device beyond its weights.

Why: the vocoder stage keeps one :class:`~.codec.streaming.CodecStream` per
request, the keys and values of the last ``window - 1`` positions of every
decoder transformer layer: about 170 MB a stream in float32 at the release's
size, once a stream is ten seconds old. Sixteen streams in a batch hold 2.7 GB,
and a batch's call allocates their next states beside them; the planner's
round 1 GiB for the stage held neither. Torch-free, for the planner; the codec
(``AudioTokenizer.footprint``) answers the same from its config.

Counted on the ``meta`` device (``omni_core.kit.allocation_peak``) for the
release's decoder: a chunk of one full stream peaks at its next state plus 6
MB, and 0.41 MB a frame. The formula below holds that from above: the state
exactly, per row one layer's keys and values joined with a chunk's (twice
the largest window's), and per frame each transformer's attention weights
over its window and four activations of its width and one of its
feed-forward's at each of its steps, and four of the audio's samples (on the
tiny test codec, whose transformers are narrow, the audio is what counts).
"""

from __future__ import annotations

from collections.abc import Sequence

from omni_qwen3_tts.codec_footprint import CodecFootprint

#: A decoder transformer: (steps per frame, layers, width, heads, window, feed-forward).
Stage = tuple[int, int, int, int, int, int]

#: The release decoder's transformers, first to last (MOSS-Audio-Tokenizer's
#: ``config.json``: a 10-second window at 12.5, 25, 50 and 100 Hz).
RELEASE_DECODER: tuple[Stage, ...] = (
    (1, 32, 1280, 20, 125, 5120),
    (2, 12, 768, 12, 250, 3072),
    (4, 12, 768, 12, 500, 3072),
    (8, 12, 768, 12, 1000, 3072),
)
SAMPLES_PER_FRAME = 1920

#: Most rows a captured chunk has by default (the vocoder's ``factory.cuda_graph_max_bs``;
#: ``codec/graphs.py``): the graphs share one tensor of full windows for their largest
#: bucket, 170 MB a row at the release's size in float32, so 8 rows keep 1.35 GB where 16
#: keep 2.7 GB: the default leaves ``examples/moss_tts.toml``'s vocoder room beside its
#: engine on an 80 GB GPU (the plan: 16.93 GiB of the 20 left; 18.25 GiB with 16 rows),
#: and a GPU with memory to spare may take 16. A batch of more rows is a chunk's worth of
#: arithmetic for each of them, where launching kernels matters least.
CAPTURED_ROWS = 8


def codec_footprint(
    stages: Sequence[Stage],
    itemsize: int,
    samples_per_frame: int = SAMPLES_PER_FRAME,
    captured_rows: int = CAPTURED_ROWS,
) -> CodecFootprint:
    """The footprint of a MOSS codec decoder made of ``stages`` (see :data:`Stage`), its
    captured chunks at most ``captured_rows`` rows (the vocoder's ``cuda_graph_max_bs``)."""
    state = sum(2 * layers * width * (window - 1) for _, layers, width, _, window, _ in stages)
    row = max(4 * width * window for _, _, width, _, window, _ in stages)
    frame = 4 * samples_per_frame  # the last projection's output and the audio made of it
    frame += sum(
        steps * (heads * window + 4 * width + ffn) for steps, _, width, heads, window, ffn in stages
    )
    return CodecFootprint(
        state_bytes=state * itemsize + 8,  # and the stream's position, one int64
        frame_bytes=frame * itemsize,
        samples_per_frame=samples_per_frame,
        itemsize=itemsize,
        row_bytes=row * itemsize,
        shared_state=True,  # captured chunks share one tensor of full windows (codec/graphs.py)
        captured_rows=captured_rows,
    )
