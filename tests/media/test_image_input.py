"""The bounded image decoder: format by magic bytes, size from the header, then the pixels."""

from __future__ import annotations

import base64
import io
import struct
import sys
import time
import zlib

import numpy as np
import pytest

Image = pytest.importorskip("PIL.Image")

from PIL import ImageFile  # noqa: E402

from omni_core.errors import OmniError  # noqa: E402
from omni_core.media import (  # noqa: E402
    ImageLimits,
    MediaError,
    decode_base64_image,
    decode_image,
    probe_image,
)
from omni_core.media.image_input import sniff_image  # noqa: E402

FIELD = "messages.0.content.1.image_url.url"
LIMITS = ImageLimits()


def pattern(width: int = 24, height: int = 16) -> np.ndarray:
    """A non-square image of four flat colours (exact through GIF's palette)."""
    pixels = np.zeros((height, width, 3), dtype=np.uint8)
    pixels[: height // 2, : width // 2] = (255, 0, 0)
    pixels[: height // 2, width // 2 :] = (0, 255, 0)
    pixels[height // 2 :, : width // 2] = (0, 0, 255)
    pixels[height // 2 :, width // 2 :] = (250, 250, 10)
    return pixels


def encode(image: Image.Image, fmt: str, **options) -> bytes:
    out = io.BytesIO()
    image.save(out, fmt, **options)
    return out.getvalue()


def png_chunk(kind: bytes, data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))


def png_declaring(width: int, height: int) -> bytes:
    """A tiny PNG whose IHDR claims ``width`` x ``height`` RGB pixels (its data is a few bytes)."""
    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return (
        b"\x89PNG\r\n\x1a\n"
        + png_chunk(b"IHDR", ihdr)
        + png_chunk(b"IDAT", zlib.compress(b"\0" * 1000))
        + png_chunk(b"IEND", b"")
    )


@pytest.fixture
def no_decoding(monkeypatch):
    """Fail the test if any pixel data is decoded."""

    def refuse(self):
        raise AssertionError("pixels were decoded before the header was checked")

    monkeypatch.setattr(ImageFile.ImageFile, "load", refuse)


# Round trips ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("fmt", "options"),
    [("PNG", {}), ("BMP", {}), ("GIF", {}), ("WEBP", {"lossless": True})],
)
def test_lossless_formats_round_trip_exactly(fmt, options):
    pixels = pattern()
    decoded = decode_image(encode(Image.fromarray(pixels), fmt, **options), FIELD, LIMITS)
    assert decoded.shape == (16, 24, 3) and decoded.dtype == np.uint8
    np.testing.assert_array_equal(decoded, pixels)


def test_jpeg_round_trips_within_compression_error():
    pixels = pattern(64, 48)
    decoded = decode_image(encode(Image.fromarray(pixels), "JPEG", quality=95), FIELD, LIMITS)
    assert decoded.shape == (48, 64, 3)
    # away from the colour edges, JPEG at q95 is within a few levels
    error = np.abs(decoded[4:20, 4:28].astype(int) - pixels[4:20, 4:28].astype(int))
    assert error.max() <= 8


def test_the_array_is_writable_contiguous_and_owned():
    decoded = decode_image(encode(Image.fromarray(pattern()), "PNG"), FIELD, LIMITS)
    assert decoded.flags.writeable and decoded.flags.c_contiguous
    decoded[0, 0] = 7  # the caller may normalise in place


def test_an_animated_gif_gives_its_first_frame():
    first = Image.fromarray(pattern())
    second = Image.fromarray(np.full((16, 24, 3), 128, dtype=np.uint8))
    raw = encode(first, "GIF", save_all=True, append_images=[second], duration=100)
    assert Image.open(io.BytesIO(raw)).n_frames == 2
    np.testing.assert_array_equal(decode_image(raw, FIELD, LIMITS), pattern())


# Pixel formats -> RGB ------------------------------------------------------------------


def test_rgba_is_composited_on_white_like_the_qwen_reference():
    rgba = np.zeros((2, 3, 4), dtype=np.uint8)
    rgba[0, 0] = (10, 20, 30, 0)  # fully transparent: white, not (10, 20, 30)
    rgba[0, 1] = (10, 20, 30, 255)  # opaque: itself
    rgba[0, 2] = (0, 0, 0, 128)  # half: grey
    decoded = decode_image(encode(Image.fromarray(rgba, "RGBA"), "PNG"), FIELD, LIMITS)
    assert decoded.shape == (2, 3, 3)
    assert tuple(decoded[0, 0]) == (255, 255, 255)
    assert tuple(decoded[0, 1]) == (10, 20, 30)
    assert all(abs(int(v) - 127) <= 1 for v in decoded[0, 2])


def test_grey_with_alpha_is_composited_on_white():
    la = Image.new("LA", (2, 1))
    la.putpixel((0, 0), (40, 0))
    la.putpixel((1, 0), (40, 255))
    decoded = decode_image(encode(la, "PNG"), FIELD, LIMITS)
    assert decoded[0].tolist() == [[255, 255, 255], [40, 40, 40]]


def test_a_palette_with_a_transparent_index_is_composited_on_white():
    palette = Image.new("P", (2, 1))
    palette.putpalette([200, 0, 0, 0, 0, 200] + [0] * 762)
    palette.putpixel((0, 0), 0)
    palette.putpixel((1, 0), 1)
    raw = encode(palette, "PNG", transparency=0)
    assert Image.open(io.BytesIO(raw)).mode == "P"
    assert decode_image(raw, FIELD, LIMITS)[0].tolist() == [[255, 255, 255], [0, 0, 200]]


def test_greyscale_and_palette_become_rgb():
    grey = Image.fromarray(np.array([[0, 100, 255]], dtype=np.uint8), "L")
    assert decode_image(encode(grey, "PNG"), FIELD, LIMITS)[0].tolist() == [
        [0, 0, 0],
        [100, 100, 100],
        [255, 255, 255],
    ]
    palette = Image.fromarray(pattern()).convert("P", palette=Image.Palette.ADAPTIVE)
    assert palette.mode == "P"
    np.testing.assert_array_equal(decode_image(encode(palette, "PNG"), FIELD, LIMITS), pattern())


def test_sixteen_bit_grey_is_scaled_not_clipped():
    wide = np.array([[0, 0x4000, 0x8000, 0xFFFF]], dtype=np.uint16)
    sixteen = Image.fromarray(wide)
    assert sixteen.mode.startswith("I;16")
    raw = encode(sixteen, "PNG")
    assert Image.open(io.BytesIO(raw)).mode.startswith("I")  # 16-bit grey reaches the decoder
    assert decode_image(raw, FIELD, LIMITS)[0, :, 0].tolist() == [0, 64, 128, 255]


def test_cmyk_jpeg_becomes_rgb():
    cmyk = Image.fromarray(pattern(32, 32)).convert("CMYK")
    decoded = decode_image(encode(cmyk, "JPEG", quality=95), FIELD, LIMITS)
    assert decoded.shape == (32, 32, 3)
    assert np.abs(decoded[4, 4].astype(int) - (255, 0, 0)).max() <= 12


# EXIF orientation ----------------------------------------------------------------------


def sideways_photo(orientation: int | None) -> bytes:
    """40 wide x 20 high, left half red, right half blue, with an EXIF orientation tag."""
    pixels = np.zeros((20, 40, 3), dtype=np.uint8)
    pixels[:, :20] = (255, 0, 0)
    pixels[:, 20:] = (0, 0, 255)
    image = Image.fromarray(pixels)
    exif = Image.Exif()
    if orientation is not None:
        exif[0x0112] = orientation
    return encode(image, "JPEG", quality=95, exif=exif.tobytes())


def test_exif_orientation_is_applied():
    upright = decode_image(sideways_photo(None), FIELD, LIMITS)
    assert upright.shape == (20, 40, 3)
    rotated = decode_image(sideways_photo(6), FIELD, LIMITS)  # 6: "rotate 90 clockwise to view"
    assert rotated.shape == (40, 20, 3)
    assert rotated[5, 10, 0] > 200 and rotated[5, 10, 2] < 50  # the left (red) half is on top
    assert rotated[35, 10, 2] > 200 and rotated[35, 10, 0] < 50


def test_damaged_exif_loses_only_the_rotation():
    raw = sideways_photo(6)
    start = raw.index(b"Exif\0\0")
    damaged = raw[: start + 6] + b"\xff" * 8 + raw[start + 14 :]  # the TIFF header is garbage
    assert decode_image(damaged, FIELD, LIMITS).shape == (20, 40, 3)


# Bounds: checked on the header, before any pixel is decoded -----------------------------


def test_a_decompression_bomb_is_refused_from_its_header_at_once(no_decoding):
    raw = png_declaring(100_000, 100_000)
    assert len(raw) < 200
    started = time.monotonic()
    with pytest.raises(MediaError, match="pixels") as caught:
        decode_image(raw, FIELD, LIMITS)
    assert time.monotonic() - started < 5  # no_decoding fails the test at any decode
    assert caught.value.field == FIELD and FIELD in caught.value.message


def test_a_size_under_pillows_own_threshold_is_still_refused_by_the_limit(no_decoding):
    # 81 MP is below Pillow's MAX_IMAGE_PIXELS (89.5 MP): only our check stands in the way
    assert Image.MAX_IMAGE_PIXELS > 9000 * 9000
    with pytest.raises(MediaError, match=r"9000 x 9000 = 81000000 pixels; the limit is 67108864"):
        decode_image(png_declaring(9000, 9000), FIELD, LIMITS)


def test_the_pixel_limit_applies_to_valid_images_too():
    raw = encode(Image.fromarray(pattern(200, 100)), "PNG")
    with pytest.raises(MediaError, match="200 x 100 = 20000 pixels; the limit is 19999"):
        decode_image(raw, FIELD, ImageLimits(max_pixels=19_999))
    assert decode_image(raw, FIELD, ImageLimits(max_pixels=20_000)).shape == (100, 200, 3)


def test_the_header_is_judged_before_the_truncated_data_behind_it(no_decoding):
    # the IDAT holds far too little for 5000 x 5000, but the size is refused first
    with pytest.raises(MediaError, match="the limit is 1000000 pixels"):
        decode_image(png_declaring(5000, 5000), FIELD, ImageLimits(max_pixels=1_000_000))


def test_side_and_aspect_limits():
    narrow = encode(Image.new("RGB", (2010, 10)), "PNG")
    with pytest.raises(MediaError, match="at most 200 times the shorter"):
        decode_image(narrow, FIELD, LIMITS)
    assert decode_image(narrow, FIELD, ImageLimits(max_aspect=201)).shape == (10, 2010, 3)
    with pytest.raises(MediaError, match="no side may exceed 1000"):
        decode_image(narrow, FIELD, ImageLimits(max_side=1000, max_aspect=1000))


def test_the_encoded_size_is_bounded():
    raw = encode(Image.fromarray(pattern()), "BMP")
    with pytest.raises(MediaError, match=f"is {len(raw)} bytes; the limit is 100 bytes"):
        decode_image(raw, FIELD, ImageLimits(max_bytes=100))


def test_formats_can_be_restricted():
    raw = encode(Image.fromarray(pattern()), "JPEG")
    with pytest.raises(MediaError, match="is a JPEG image; accepted here: PNG or WEBP"):
        decode_image(raw, FIELD, ImageLimits(formats=("png", "webp")))


def test_limits_are_validated():
    with pytest.raises(ValueError, match="subset"):
        ImageLimits(formats=("tiff",))
    with pytest.raises(ValueError, match=">= 1"):
        ImageLimits(max_pixels=0)


# Damaged and foreign data --------------------------------------------------------------


@pytest.mark.parametrize(
    "raw",
    [
        b"hello, world",
        b"",
        b"RIFF\x24\x00\x00\x00WAVEfmt ",  # audio
        b"<svg xmlns='http://www.w3.org/2000/svg'/>",
        b"II*\x00\x08\x00\x00\x00",  # TIFF: Pillow reads it, we do not hand it to Pillow
        b"\x00\x00\x01\x00",  # ICO
    ],
)
def test_what_is_not_an_accepted_image_is_refused_by_its_magic(raw):
    assert sniff_image(raw) is None
    with pytest.raises(MediaError, match="is not a readable image: it is not a PNG, JPEG") as c:
        decode_image(raw, FIELD, LIMITS)
    assert c.value.field == FIELD


def test_a_real_tiff_is_refused_although_pillow_could_read_it():
    raw = encode(Image.fromarray(pattern()), "TIFF")
    assert Image.open(io.BytesIO(raw)).size == (24, 16)
    with pytest.raises(MediaError, match="it is not a PNG, JPEG, WEBP, GIF or BMP file"):
        decode_image(raw, FIELD, LIMITS)


def test_only_the_sniffed_formats_parser_sees_the_data():
    jpeg = encode(Image.fromarray(pattern()), "JPEG")
    disguised = b"\x89PNG\r\n\x1a\n" + jpeg  # PNG magic, JPEG inside: PNG's parser refuses
    with pytest.raises(MediaError, match="is not a readable PNG image: its header is damaged"):
        decode_image(disguised, FIELD, LIMITS)


@pytest.mark.parametrize("fmt", ["PNG", "JPEG", "GIF", "BMP", "WEBP"])
def test_truncated_data_is_refused_naming_the_field(fmt):
    noise = np.random.default_rng(0).integers(0, 256, (64, 64, 3), dtype=np.uint8)
    raw = encode(Image.fromarray(noise), fmt)
    for cut in (len(raw) // 2, 30):
        with pytest.raises(MediaError, match=f"is not a readable {fmt} image") as caught:
            decode_image(raw[:cut], FIELD, LIMITS)
        assert caught.value.field == FIELD and repr(FIELD) in caught.value.message


def test_corrupt_compressed_data_is_refused():
    raw = bytearray(encode(Image.fromarray(pattern(64, 64)), "PNG"))
    start = raw.index(b"IDAT") + 4
    raw[start + 2 : start + 30] = b"\xa5" * 28  # the zlib stream, not the header
    with pytest.raises(MediaError, match="is not a readable PNG image"):
        decode_image(bytes(raw), FIELD, LIMITS)


def test_a_header_declaring_no_pixels_is_refused():
    with pytest.raises(MediaError, match=r"header is damaged|empty image \(0 x 5"):
        decode_image(png_declaring(0, 5), FIELD, LIMITS)


# base64 and the missing dependency -----------------------------------------------------


def test_base64_round_trip_and_refusals():
    raw = encode(Image.fromarray(pattern()), "PNG")
    text = base64.b64encode(raw).decode()
    np.testing.assert_array_equal(decode_base64_image(text, FIELD, LIMITS), pattern())
    with pytest.raises(MediaError, match="not valid base64"):
        decode_base64_image(text[:40] + "\n" + text[40:], FIELD, LIMITS)
    with pytest.raises(MediaError, match="must be a base64 string"):
        decode_base64_image(raw, FIELD, LIMITS)
    with pytest.raises(MediaError, match="the limit is 100 bytes"):
        decode_base64_image(text, FIELD, ImageLimits(max_bytes=100))


def test_without_pillow_the_error_is_the_servers_and_says_what_to_install(monkeypatch):
    raw = encode(Image.fromarray(pattern()), "PNG")
    monkeypatch.setitem(sys.modules, "PIL", None)
    with pytest.raises(OmniError, match="Pillow package is not installed") as caught:
        decode_image(raw, FIELD, LIMITS)
    assert not isinstance(caught.value, MediaError)  # not the client's fault: no 400
    assert caught.value.hint == "pip install pillow"


# Probing the header --------------------------------------------------------------------


@pytest.mark.parametrize("fmt", ["PNG", "JPEG", "WEBP", "GIF", "BMP"])
def test_a_probe_reads_the_size_without_decoding_a_pixel(fmt, no_decoding):
    raw = encode(Image.fromarray(pattern(24, 16)), fmt)
    assert probe_image(raw, FIELD, LIMITS) == (24, 16)


def test_a_probe_refuses_what_decoding_would_refuse_before_decoding(no_decoding):
    with pytest.raises(MediaError, match="the limit is 1000 pixels"):
        probe_image(png_declaring(100, 100), FIELD, ImageLimits(max_pixels=1000))
    with pytest.raises(MediaError, match="not a readable image"):
        probe_image(b"GIF", FIELD, LIMITS)


@pytest.mark.parametrize(("orientation", "size"), [(None, (40, 20)), (1, (40, 20)), (6, (20, 40))])
def test_a_probe_reports_the_size_after_the_exif_rotation(orientation, size):
    raw = sideways_photo(orientation)
    assert probe_image(raw, FIELD, LIMITS) == size
    assert decode_image(raw, FIELD, LIMITS).shape[:2] == (size[1], size[0])
