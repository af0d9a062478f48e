"""Decoding uploaded images under bounds that hold whatever the file claims.

A compressed image is tiny next to its pixels: a PNG of a few hundred bytes
can declare 100000 x 100000 pixels (40 GB as RGBA). So nothing is decoded
before its size is known and accepted:

1. the encoded size is checked (before base64 is decoded, for base64 input);
2. the format is recognised by its magic bytes (PNG, JPEG, WEBP, GIF, BMP
   only), and Pillow is told to use that one plugin, so its parsers for the
   dozens of other formats it knows never see client bytes;
3. ``Image.open`` reads the header only; the declared width, height, their
   product and the aspect ratio are checked against :class:`ImageLimits`
   here, not left to Pillow's process-wide ``MAX_IMAGE_PIXELS`` (which only
   warns below twice its value, and which anyone may change). A header Pillow
   itself calls a bomb is refused the same way;
4. only then are the pixels decoded; a truncated or corrupt stream is refused
   naming the field (Pillow's ``LOAD_TRUNCATED_IMAGES`` is never set).

What comes out matches what the Qwen-VL/Omni reference pipeline
(``qwen_vl_utils``/``qwen_omni_utils``) feeds the image processor, plus the
EXIF rotation that ``transformers.image_utils.load_image`` applies:

- the EXIF orientation tag is applied (phone photos are stored sideways with a
  tag saying so); a damaged EXIF block is ignored, not refused;
- transparency is composited onto white. The reference does exactly this for
  RGBA images (the common transparent PNG); for the rarer LA, PA and
  palette-with-transparency images it calls ``.convert("RGB")``, which shows
  whatever colour the transparent pixels happen to hold. Here every kind of
  transparency goes onto white, so the same picture saved two ways gives the
  same pixels;
- 16-bit greyscale is scaled to 8 bits (Pillow's ``.convert("RGB")`` would
  clip it to white);
- animated GIF, WEBP and PNG give their first frame.

numpy and Pillow are imported on first use: the core's import stays light.
Pillow is a dependency of the plugins that decode images, not of the core.
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import io
from dataclasses import dataclass
from typing import Any

from ..errors import OmniError
from .errors import MediaError

FORMATS = ("png", "jpeg", "webp", "gif", "bmp")
PILLOW_FORMATS = {"png": "PNG", "jpeg": "JPEG", "webp": "WEBP", "gif": "GIF", "bmp": "BMP"}
WHITE = (255, 255, 255)
ALPHA_MODES = ("RGBA", "RGBa", "LA", "La", "PA")


@dataclass(frozen=True)
class ImageLimits:
    """What one uploaded image may be; every bound is checked before decoding."""

    max_bytes: int = 32 * 1024 * 1024  # the encoded file
    max_pixels: int = 8192 * 8192  # width x height as declared: 64 MP, 256 MiB as RGBA
    max_side: int = 32768
    max_aspect: float = 200.0  # the Qwen-VL image processors refuse longer/shorter side > 200
    formats: tuple[str, ...] = FORMATS

    def __post_init__(self) -> None:
        if self.max_bytes < 1 or self.max_pixels < 1 or self.max_side < 1:
            raise ValueError(f"max_bytes, max_pixels and max_side must be >= 1: {self}")
        if self.max_aspect < 1:
            raise ValueError(f"max_aspect must be >= 1: {self}")
        unknown = [f for f in self.formats if f not in FORMATS]
        if unknown or not self.formats:
            raise ValueError(f"formats must be a non-empty subset of {FORMATS}, got {self.formats}")


def decode_base64_image(encoded: Any, field: str, limits: ImageLimits) -> Any:
    """``encoded`` (base64 of an image file) decoded within ``limits``: see :func:`decode_image`."""
    if not isinstance(encoded, str):
        raise MediaError(field, f"{field!r} must be a base64 string of a {_names(limits)} image")
    if len(encoded) // 4 * 3 > limits.max_bytes:
        raise MediaError(
            field,
            f"{field!r} is about {len(encoded) // 4 * 3} bytes; the limit is "
            f"{limits.max_bytes} bytes",
        )
    try:
        raw = base64.b64decode(encoded, validate=True)
    except (binascii.Error, ValueError):
        raise MediaError(
            field,
            f"{field!r} is not a readable image: it is not valid base64 "
            "(standard alphabet, padded, no line breaks)",
        ) from None
    return decode_image(raw, field, limits)


def probe_image(raw: bytes, field: str, limits: ImageLimits) -> tuple[int, int]:
    """``(width, height)`` of the image file ``raw`` from its header; no pixel is decoded.

    Every check :func:`decode_image` makes before decoding is made here, so a
    request can add up its images' pixels and prompt tokens and refuse itself
    before the first one is decoded.
    """
    with _open_header(raw, field, limits) as image:
        width, height = image.size
        _check_size(field, limits, width, height)
        if _turned_sideways(image):
            width, height = height, width
        return width, height


def decode_image(raw: bytes, field: str, limits: ImageLimits) -> Any:
    """The image file ``raw`` as a writable uint8 numpy array ``[height, width, 3]``, RGB.

    Raises :class:`MediaError` naming ``field`` for anything refused (see the
    module docstring for what is checked, and in which order).
    """
    import numpy as np

    image_module, image_ops = _pillow()
    kind = sniff_image(raw)
    label = f"{field!r} is not a readable {(kind or '').upper()} image"
    image = _open_header(raw, field, limits)
    with image:
        _check_size(field, limits, *image.size)
        try:
            image.load()
        except MemoryError:
            raise
        except Exception as exc:  # Pillow's decoders fail with OSError, SyntaxError, ValueError…
            raise MediaError(field, f"{label}: {exc}") from None
        with contextlib.suppress(Exception):  # a damaged EXIF block only loses the rotation
            image_ops.exif_transpose(image, in_place=True)
        try:
            rgb = _to_rgb(image, image_module, np)
        except MemoryError:
            raise
        except Exception as exc:
            raise MediaError(
                field, f"{label}: its pixels ({image.mode}) cannot become RGB: {exc}"
            ) from None
        return np.array(rgb, dtype=np.uint8)


def _open_header(raw: bytes, field: str, limits: ImageLimits) -> Any:
    """``raw`` opened by the one Pillow plugin of its format, its header read, nothing decoded."""
    if len(raw) > limits.max_bytes:
        raise MediaError(
            field, f"{field!r} is {len(raw)} bytes; the limit is {limits.max_bytes} bytes"
        )
    kind = sniff_image(raw)
    if kind is None:
        raise MediaError(
            field, f"{field!r} is not a readable image: it is not a {_names(limits)} file"
        )
    if kind not in limits.formats:
        raise MediaError(
            field, f"{field!r} is a {kind.upper()} image; accepted here: {_names(limits)}"
        )
    image_module, _ = _pillow()
    try:
        return image_module.open(io.BytesIO(raw), formats=[PILLOW_FORMATS[kind]])
    except image_module.DecompressionBombError:  # over twice Pillow's MAX_IMAGE_PIXELS
        cap = min(limits.max_pixels, 2 * (image_module.MAX_IMAGE_PIXELS or limits.max_pixels))
        raise MediaError(
            field, f"{field!r} declares more pixels than the limit of {cap} pixels"
        ) from None
    except MemoryError:
        raise
    except Exception:  # Pillow reports a bad header as several types
        raise MediaError(
            field,
            f"{field!r} is not a readable {kind.upper()} image: its header is damaged or cut short",
        ) from None


def _turned_sideways(image: Any) -> bool:
    """Whether the EXIF orientation swaps width and height, as ``exif_transpose`` will.

    Read only from an EXIF block the header already holds: ``getexif()`` on a
    PNG without one decodes the whole image to look for it after the pixels.
    A damaged EXIF block turns nothing, as when decoding.
    """
    block = image.info.get("exif")
    if not block:
        return False
    image_module, _ = _pillow()
    try:
        orientation = image_module.Exif()
        orientation.load(block)
        return orientation.get(0x0112, 1) in (5, 6, 7, 8)
    except Exception:
        return False


def sniff_image(raw: bytes) -> str | None:
    """The format of ``raw`` from its magic bytes, or None."""
    head = bytes(raw[:12])
    if head[:8] == b"\x89PNG\r\n\x1a\n":
        return "png"
    if head[:3] == b"\xff\xd8\xff":
        return "jpeg"
    if head[:4] == b"RIFF" and head[8:12] == b"WEBP":
        return "webp"
    if head[:6] in (b"GIF87a", b"GIF89a"):
        return "gif"
    if head[:2] == b"BM":
        return "bmp"
    return None


def _check_size(field: str, limits: ImageLimits, width: int, height: int) -> None:
    if width < 1 or height < 1:
        raise MediaError(field, f"{field!r} declares an empty image ({width} x {height} pixels)")
    if width * height > limits.max_pixels:
        raise MediaError(
            field,
            f"{field!r} is {width} x {height} = {width * height} pixels; the limit is "
            f"{limits.max_pixels} pixels",
        )
    if max(width, height) > limits.max_side:
        raise MediaError(
            field,
            f"{field!r} is {width} x {height} pixels; no side may exceed {limits.max_side}",
        )
    if max(width, height) / min(width, height) > limits.max_aspect:
        raise MediaError(
            field,
            f"{field!r} is {width} x {height} pixels; the longer side may be at most "
            f"{limits.max_aspect:g} times the shorter",
        )


def _to_rgb(image: Any, image_module: Any, np: Any) -> Any:
    """``image`` as an RGB Pillow image (see the module docstring for alpha and 16-bit)."""
    mode = image.mode
    if mode == "RGB":
        return image
    if mode == "I" or mode.startswith("I;16"):  # 16-bit greyscale PNG
        wide = np.asarray(image).astype(np.int64)
        grey = (np.clip(wide, 0, 65535) >> 8).astype(np.uint8)
        return image_module.fromarray(grey, "L").convert("RGB")
    if mode in ALPHA_MODES or "transparency" in image.info:
        rgba = image.convert("RGBA")
        flat = image_module.new("RGB", rgba.size, WHITE)
        flat.paste(rgba, mask=rgba.getchannel("A"))
        return flat
    return image.convert("RGB")  # L, 1, P, CMYK, YCbCr


def _pillow() -> tuple[Any, Any]:
    try:
        from PIL import Image, ImageOps
    except ImportError:
        raise OmniError(
            "this server cannot decode images: the Pillow package is not installed",
            hint="pip install pillow",
        ) from None
    return Image, ImageOps


def _names(limits: ImageLimits) -> str:
    names = [f.upper() for f in limits.formats]
    return names[0] if len(names) == 1 else ", ".join(names[:-1]) + f" or {names[-1]}"
