"""Reading the pictures of a run in tests of redaction (controller/redaction.py): a picture's pixels, a
screen px region of it, and whether that region holds the fill colour only."""

from __future__ import annotations

import io

from PIL import Image

from controller.redaction import FILL


def rgb(data: bytes) -> Image.Image:
    """The picture ``data`` (PNG or JPEG bytes) as RGB pixels."""
    with Image.open(io.BytesIO(data)) as image:
        return image.convert("RGB")


def region(image: Image.Image, box, frame=(0, 0, 1280, 800)) -> Image.Image:
    """The part of ``image`` (showing the screen px ``frame``) that the screen px ``box`` covers."""
    sx, sy = image.width / frame[2], image.height / frame[3]
    x, y, w, h = box
    return image.crop((int((x - frame[0]) * sx), int((y - frame[1]) * sy),
                       int((x + w - frame[0]) * sx), int((y + h - frame[1]) * sy)))


def filled(image: Image.Image) -> bool:
    """Every pixel within 8 of :data:`FILL` (a JPEG's and the video codec's blocks are near, not exact)."""
    return all(abs(lo - f) <= 8 and abs(hi - f) <= 8 for (lo, hi), f in zip(image.getextrema(), FILL))
