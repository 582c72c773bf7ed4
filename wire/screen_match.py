"""The screen comparison rule: does the screen still show, where an action will land, what a screenshot showed?

One home for the rule both sides use (docs/ARCHITECTURE.md, "The screen comparison rule"): the agent
applies it to a computer call a person approved, just before the call's first action (the approval is
bound to the screenshot the person was shown), and ``desktop-sandbox replay`` applies it to each replayed
step (the recorded screenshot against the replay's). It needs Pillow besides pydantic; the guest and the
controller both have it.

The rule, in the image's own px (model px: the screenshot as it was sent):

* **Regions** (:func:`regions_for`): a square of ``2 * margin + 1`` px centred on every point the call's
  actions touch (``wire.actions`` ``points()``: a click's point, every point of a drag path, a scroll's
  point...), clipped to the image; a call whose actions touch no point (``type``, ``keypress``, ``wait``)
  is compared around ``fallback`` (the last point acted on: where the keyboard's focus most likely
  is), or, with none, over the whole image in squares of at most 513 px (:func:`tiles`: a clock stays
  under ``max_changed`` of its square, a new page does not). Overlapping squares stay separate (each is
  judged on its own).
* **A pixel differs** when its largest RGB channel difference is above ``tolerance`` (0-255): the
  same screen grabbed twice stays under it, a changed or moved control (even a white field on an
  off-white page) does not.
* **A region matches** when at most ``max_changed`` of its pixels differ (a blinking caret, a moving
  pointer shadow stay under it); **the screens match** when every region does. Nothing outside the
  regions is looked at: a clock elsewhere on the screen never refuses.

Defaults (:class:`MatchRule`): ``margin`` 24 px, ``tolerance`` 16, ``max_changed`` 0.05; a task may set
its own (``[approvals]`` for the binding; ``replay --tolerance/--max-changed``). Both images come through
the same pipeline (the agent's grab, scaled, and for a JPEG screenshot encoded at its quality:
:attr:`ScreenBinding.jpeg_quality`), so an unchanged screen compares (nearly) exactly and a low
tolerance can see a white field move on an off-white page.
"""

from __future__ import annotations

import base64
import io
from typing import Any, Iterable, Optional

from PIL import Image, ImageChops
from pydantic import BaseModel, ConfigDict, Field

MAX_REGIONS = 64
"""Most regions one comparison looks at (a drag of 100 points is compared on its first 64)."""
MAX_REGION_PNG_BYTES = 512 * 1024
"""Largest encoded reference region accepted (a 2 * 256 + 1 px square of noise is well under it)."""


class MatchRule(BaseModel):
    """How close is close enough (module docstring): ``margin`` model px around each point (0-256),
    ``tolerance`` per RGB channel (0-255), ``max_changed`` the share of a region's pixels allowed to
    differ (0-1)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    margin: int = Field(default=24, ge=0, le=256, strict=True)
    tolerance: int = Field(default=16, ge=0, le=255, strict=True)
    max_changed: float = Field(default=0.05, ge=0.0, le=1.0)


class Region(BaseModel):
    """One compared square, in image px: ``x, y, w, h``."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    x: int = Field(ge=0, strict=True)
    y: int = Field(ge=0, strict=True)
    w: int = Field(ge=1, strict=True)
    h: int = Field(ge=1, strict=True)

    def box(self) -> tuple[int, int, int, int]:
        """``(left, top, right, bottom)`` for :meth:`PIL.Image.Image.crop`."""
        return self.x, self.y, self.x + self.w, self.y + self.h


class RegionResult(BaseModel):
    """How one region compared: ``changed`` the share of its pixels that differ (0-1), ``matched``."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    region: Region
    changed: float
    matched: bool


class MatchResult(BaseModel):
    """The comparison: ``matched`` when every region matched (no regions: matched), each region's result."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    matched: bool
    regions: list[RegionResult]

    def worst(self) -> RegionResult | None:
        """The region that changed most (None without regions)."""
        return max(self.regions, key=lambda r: r.changed, default=None)

    def summary(self) -> str:
        """``2 of 3 regions matched; worst (610,231 49x49) 41.0% changed``."""
        worst = self.worst()
        if worst is None:
            return "no region to compare"
        ok = sum(r.matched for r in self.regions)
        r = worst.region
        return (f"{ok} of {len(self.regions)} regions matched; worst ({r.x},{r.y} {r.w}x{r.h}) "
                f"{worst.changed:.1%} changed")


def regions_for(points: Iterable[tuple[int, int]], size: tuple[int, int], rule: MatchRule,
                fallback: tuple[int, int] | None = None) -> list[Region]:
    """The regions to compare for actions touching ``points`` (image px) on an image of ``size`` (w, h):
    a square of side ``2 * rule.margin + 1`` centred on each point, clipped to the image, at most
    :data:`MAX_REGIONS`, duplicates dropped. No points: the square around ``fallback``, or with no
    ``fallback`` the whole image (:func:`tiles`). Points outside the image give no region."""
    width, height = size
    seen: list[Region] = []
    pts = list(points) or ([fallback] if fallback is not None else [])
    if not pts:
        return tiles(size)
    for px, py in pts:
        if not (0 <= px < width and 0 <= py < height):
            continue
        left, top = max(0, px - rule.margin), max(0, py - rule.margin)
        right, bottom = min(width, px + rule.margin + 1), min(height, py + rule.margin + 1)
        region = Region(x=left, y=top, w=right - left, h=bottom - top)
        if region not in seen:
            seen.append(region)
        if len(seen) >= MAX_REGIONS:
            break
    return seen


def tiles(size: tuple[int, int]) -> list[Region]:
    """The whole image of ``size`` (w, h) as squares of at most ``2 * 256 + 1`` px (the largest region),
    row by row: what is compared when an action touches no point and none was acted on before."""
    side = 2 * 256 + 1
    width, height = size
    return [Region(x=x, y=y, w=min(side, width - x), h=min(side, height - y))
            for y in range(0, height, side) for x in range(0, width, side)][:MAX_REGIONS]


def changed_share(reference: Image.Image, current: Image.Image, tolerance: int) -> float:
    """Share (0-1) of pixels whose largest RGB channel difference is above ``tolerance``; the two images
    must be the same size (RGB)."""
    r, g, b = ImageChops.difference(reference.convert("RGB"), current.convert("RGB")).split()
    hist = ImageChops.lighter(ImageChops.lighter(r, g), b).histogram()
    total = sum(hist)
    return sum(hist[tolerance + 1:]) / total if total else 0.0


def compare(reference: Image.Image, current: Image.Image, regions: Iterable[Region], rule: MatchRule) -> MatchResult:
    """Compare ``current`` with ``reference`` (both the same frame at the same size, image px) in each
    region, by the rule (module docstring). Raises ValueError when the sizes differ (a screenshot of
    another frame or scale cannot be compared: the caller's error, never a match)."""
    if reference.size != current.size:
        raise ValueError(f"cannot compare a {reference.width}x{reference.height} screenshot with a "
                         f"{current.width}x{current.height} one")
    results = []
    for region in regions:
        share = changed_share(reference.crop(region.box()), current.crop(region.box()), rule.tolerance)
        results.append(RegionResult(region=region, changed=round(share, 4), matched=share <= rule.max_changed))
    return MatchResult(matched=all(r.matched for r in results), regions=results)


def compare_crops(references: list[Image.Image], current: Image.Image, regions: list[Region],
                  rule: MatchRule) -> MatchResult:
    """As :func:`compare`, with the reference given as one crop per region (what the controller sends
    the agent: only the regions, never the whole screenshot). Raises ValueError when a crop's size is
    not its region's or the counts differ."""
    if len(references) != len(regions):
        raise ValueError(f"{len(references)} reference crops for {len(regions)} regions")
    results = []
    for crop, region in zip(references, regions):
        if crop.size != (region.w, region.h):
            raise ValueError(f"a reference crop is {crop.width}x{crop.height}, its region {region.w}x{region.h}")
        if region.x + region.w > current.width or region.y + region.h > current.height:
            raise ValueError(f"region ({region.x},{region.y} {region.w}x{region.h}) is outside the "
                             f"{current.width}x{current.height} screenshot")
        share = changed_share(crop, current.crop(region.box()), rule.tolerance)
        results.append(RegionResult(region=region, changed=round(share, 4), matched=share <= rule.max_changed))
    return MatchResult(matched=all(r.matched for r in results), regions=results)


def encode_crop(image: Image.Image, region: Region) -> str:
    """The region of ``image`` as base64 PNG text (what travels to the agent)."""
    out = io.BytesIO()
    image.crop(region.box()).convert("RGB").save(out, format="PNG", compress_level=1)
    return base64.b64encode(out.getvalue()).decode("ascii")


def decode_crop(text: Any) -> Image.Image:
    """A crop sent as base64 PNG text, as an RGB image. Raises ValueError for anything else (not text,
    not base64, not a PNG, over :data:`MAX_REGION_PNG_BYTES`, or a picture larger than a region can be)."""
    if not isinstance(text, str):
        raise ValueError("a reference crop must be base64 text")
    try:
        data = base64.b64decode(text, validate=True)
    except ValueError:
        raise ValueError("a reference crop is not base64") from None
    if len(data) > MAX_REGION_PNG_BYTES:
        raise ValueError(f"a reference crop is over {MAX_REGION_PNG_BYTES} bytes")
    if not data.startswith(b"\x89PNG\r\n\x1a\n"):
        raise ValueError("a reference crop is not a PNG")
    try:
        with Image.open(io.BytesIO(data)) as img:
            side = 2 * 256 + 1
            if img.width > side or img.height > side:
                raise ValueError(f"a reference crop is {img.width}x{img.height}, larger than a region can be")
            return img.convert("RGB")
    except (OSError, Image.DecompressionBombError) as exc:
        raise ValueError(f"a reference crop cannot be decoded: {exc}") from None


class ScreenBinding(BaseModel):
    """What a bound approval sends with a computer call's first action (``POST /v1/actions``'s
    ``expect_screen``): the screenshot the person was shown, as much of it as the rule looks at.
    ``frame``: the screen area that screenshot shows, ``[x, y, w, h]`` screen px (its crop);
    ``size``: its ``[w, h]`` image px (model px: the frame downscaled); ``regions`` (image px) and one
    base64 PNG ``crops`` entry per region (:func:`encode_crop`); ``rule`` the task's.
    The agent grabs ``frame`` under the input lock, scales it to ``size`` as its screenshots are scaled
    (and encodes it as ``jpeg_quality`` says), and compares by :func:`compare_crops` before the first
    action runs."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    frame: tuple[int, int, int, int]
    size: tuple[int, int]
    regions: list[Region] = Field(min_length=1, max_length=MAX_REGIONS)
    crops: list[str] = Field(min_length=1, max_length=MAX_REGIONS)
    rule: MatchRule = MatchRule()
    jpeg_quality: Optional[int] = Field(default=None, ge=1, le=100, strict=True)
    """The approved screenshot was a JPEG of this quality: the agent encodes the frame it grabbed the
    same way before comparing (so both sides carry the same artifacts). None: it was a PNG."""

    def reference(self) -> list[Image.Image]:
        """The crops decoded (ValueError as :func:`decode_crop`; also when the counts differ or a crop is
        not its region's size)."""
        if len(self.crops) != len(self.regions):
            raise ValueError(f"{len(self.crops)} crops for {len(self.regions)} regions")
        images = [decode_crop(c) for c in self.crops]
        for img, region in zip(images, self.regions):
            if img.size != (region.w, region.h):
                raise ValueError(f"a crop is {img.width}x{img.height}, its region {region.w}x{region.h}")
            if region.x + region.w > self.size[0] or region.y + region.h > self.size[1]:
                raise ValueError(f"region ({region.x},{region.y} {region.w}x{region.h}) is outside the "
                                 f"{self.size[0]}x{self.size[1]} image")
        return images


def bind(image: Image.Image, frame: tuple[int, int, int, int], points: Iterable[tuple[int, int]], rule: MatchRule,
         fallback: tuple[int, int] | None = None, jpeg_quality: int | None = None) -> ScreenBinding:
    """The :class:`ScreenBinding` of ``image`` (the screenshot a person was shown, image px, showing
    ``frame`` of the screen; a JPEG of ``jpeg_quality`` or a PNG) for actions touching ``points``
    (image px)."""
    regions = regions_for(points, image.size, rule, fallback)
    return ScreenBinding(frame=frame, size=image.size, regions=regions,
                         crops=[encode_crop(image, r) for r in regions], rule=rule, jpeg_quality=jpeg_quality)


def as_encoded(image: Image.Image, jpeg_quality: int | None) -> Image.Image:
    """``image`` as a screenshot of it reads back: through JPEG at ``jpeg_quality`` (None: unchanged,
    PNG is lossless)."""
    if jpeg_quality is None:
        return image
    out = io.BytesIO()
    image.convert("RGB").save(out, format="JPEG", quality=jpeg_quality)
    with Image.open(io.BytesIO(out.getvalue())) as img:
        return img.convert("RGB")
