"""Model space <-> screen space.

The model sees an image; it answers in the pixels of that image ("model px"). The agent acts in
screen pixels ("screen px"). One rule maps between them (the SDK's click-offset rule): scale by the
actual size of the image last sent, round to nearest, then add the crop offset. A 800x600 shot of a
1600x1200 screen doubles both coordinates; with a crop, its origin is added after scaling.

Bounds are checked in model space, before anything is sent, and the error names the model size.
Scroll deltas are amounts, not positions: they keep their sign and never get an offset.
"""

from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction

from controller.model.errors import DesktopSandboxError


class OutOfModelBounds(DesktopSandboxError, ValueError):
    """A model-space point lies outside the image the model was sent.

    Attributes: ``x``, ``y`` (model px), ``width``, ``height`` (model image size, model px).
    """

    def __init__(self, x: int, y: int, width: int, height: int) -> None:
        super().__init__(
            f"point ({x},{y}) is outside the {width}x{height} model image "
            f"(valid: 0<=x<{width}, 0<=y<{height})"
        )
        self.x, self.y, self.width, self.height = x, y, width, height


@dataclass(frozen=True)
class Frame:
    """A rectangle of the screen, in screen px: origin (x, y) and size (w, h)."""

    x: int
    y: int
    w: int
    h: int

    def __post_init__(self) -> None:
        if self.w <= 0 or self.h <= 0 or self.x < 0 or self.y < 0:
            raise ValueError(f"invalid frame {self}")

    @classmethod
    def parse(cls, text: str) -> "Frame":
        """Parse ``"x,y,w,h"`` (the agent's ``X-Frame`` header)."""
        parts = [int(p) for p in text.replace(" ", "").split(",")]
        if len(parts) != 4:
            raise ValueError(f"frame must be x,y,w,h, got {text!r}")
        return cls(*parts)


def _round_half_up(value: Fraction) -> int:
    """Round to nearest, halves away from zero for the non-negative values used here."""
    return int((value + Fraction(1, 2)).__floor__())


@dataclass(frozen=True)
class ModelSpace:
    """The image the model was last sent and the screen region it shows.

    ``image_width`` x ``image_height``: the actual size of the image sent (model px).
    ``frame``: the screen region (screen px) the image shows: the crop, or the whole screen.
    """

    image_width: int
    image_height: int
    frame: Frame

    def __post_init__(self) -> None:
        if self.image_width <= 0 or self.image_height <= 0:
            raise ValueError(f"invalid image size {self.image_width}x{self.image_height}")

    @property
    def size_text(self) -> str:
        return f"{self.image_width}x{self.image_height}"

    def check(self, x: int, y: int) -> None:
        """Raise :class:`OutOfModelBounds` unless 0<=x<image_width and 0<=y<image_height (model px)."""
        if isinstance(x, bool) or isinstance(y, bool) or not isinstance(x, int) or not isinstance(y, int):
            raise TypeError(f"coordinates must be integers, got ({x!r},{y!r})")
        if not (0 <= x < self.image_width and 0 <= y < self.image_height):
            raise OutOfModelBounds(x, y, self.image_width, self.image_height)

    def to_screen(self, x: int, y: int) -> tuple[int, int]:
        """Map a model-space point to screen px.

        screen = frame origin + round_to_nearest(model * frame size / image size). The result is
        clamped to the frame's last pixel, which only matters when the image is larger than the
        frame (up-scaled). Raises :class:`OutOfModelBounds` for points outside the model image.
        """
        self.check(x, y)
        sx = _round_half_up(Fraction(x * self.frame.w, self.image_width))
        sy = _round_half_up(Fraction(y * self.frame.h, self.image_height))
        sx = min(sx, self.frame.w - 1)
        sy = min(sy, self.frame.h - 1)
        return self.frame.x + sx, self.frame.y + sy

    def to_model(self, sx: int, sy: int) -> tuple[int, int]:
        """Map a screen point inside the frame to model px (inverse rule, round to nearest)."""
        if not (self.frame.x <= sx < self.frame.x + self.frame.w and self.frame.y <= sy < self.frame.y + self.frame.h):
            raise ValueError(f"screen point ({sx},{sy}) is outside the frame {self.frame}")
        mx = _round_half_up(Fraction((sx - self.frame.x) * self.image_width, self.frame.w))
        my = _round_half_up(Fraction((sy - self.frame.y) * self.image_height, self.frame.h))
        return min(mx, self.image_width - 1), min(my, self.image_height - 1)


def fit_size(width: int, height: int, max_width: int | None, max_height: int | None) -> tuple[int, int]:
    """Largest size with the aspect ratio of width x height that fits max_width x max_height.

    Never up-scales; each side is rounded to nearest and at least 1 (px).
    """
    scale = Fraction(1)
    if max_width is not None and width > max_width:
        scale = min(scale, Fraction(max_width, width))
    if max_height is not None and height > max_height:
        scale = min(scale, Fraction(max_height, height))
    if scale == 1:
        return width, height
    return max(1, _round_half_up(width * scale)), max(1, _round_half_up(height * scale))
