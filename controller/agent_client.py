"""HTTP client for the guest agent API (contract 1 in ARCHITECTURE.md).

``AgentClient(base_url, token)`` wraps one keep-alive ``httpx.Client``. Coordinates it sends are
**screen pixels** (mapping from model space is the driver's job). Every non-2xx answer raises
:class:`AgentError` carrying the HTTP status and the agent's ``code``, ``message`` and ``index``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import httpx


class AgentError(RuntimeError):
    """A failed agent call: ``status`` (HTTP), ``code`` (e.g. ``unknown_key``), ``message``,
    ``index`` (the failing action's position, when the agent names one), ``body`` (parsed JSON).
    ``status`` 0 means the agent could not be reached (``code`` ``unreachable``)."""

    def __init__(self, status: int, code: str, message: str, index: int | None = None,
                 body: dict[str, Any] | None = None) -> None:
        super().__init__(f"{status} {code}: {message}" + (f" (action {index})" if index is not None else ""))
        self.status, self.code, self.message, self.index = status, code, message, index
        self.body = body or {}


@dataclass(frozen=True)
class AgentScreenshot:
    """An image from ``GET /v1/screenshot``.

    ``data`` bytes, ``mime`` type, ``screen_size`` (W, H) screen px, ``frame`` (x, y, w, h) the
    captured region in screen px, ``image_size`` (w, h) of the image in image px.
    """

    data: bytes
    mime: str
    screen_size: tuple[int, int]
    frame: tuple[int, int, int, int]
    image_size: tuple[int, int]


def _pair(value: str) -> tuple[int, int]:
    w, _, h = value.partition("x")
    return int(w), int(h)


class AgentClient:
    """Synchronous client for one agent. Thread-safe as far as ``httpx.Client`` is.

    ``timeout`` (seconds) bounds each call; keep it above the agent's ``--request-timeout`` plus its
    ``--busy-timeout`` (20 + 5 s by default) for action calls, so the agent's own ``timeout`` or
    ``busy`` answer arrives first.
    """

    def __init__(self, base_url: str, token: str, *, timeout: float = 30.0,
                 transport: httpx.BaseTransport | None = None) -> None:
        self.base_url = base_url.rstrip("/")
        self._http = httpx.Client(
            base_url=self.base_url, headers={"Authorization": f"Bearer {token}"}, timeout=timeout,
            transport=transport,
        )

    def close(self) -> None:
        """Close the underlying connection pool."""
        self._http.close()

    def __enter__(self) -> "AgentClient":
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    # -- plumbing ----------------------------------------------------------------------------
    def _request(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        try:
            resp = self._http.request(method, path, **kwargs)
        except httpx.TransportError as exc:
            raise AgentError(0, "unreachable", f"{method} {path}: {exc}") from exc
        if resp.status_code >= 400:
            try:
                body = resp.json()
                err = body.get("error", {}) if isinstance(body, dict) else {}
            except ValueError:
                body, err = {}, {}
            raise AgentError(resp.status_code, str(err.get("code", "http_error")),
                             str(err.get("message", resp.text[:200])), err.get("index"), body)
        return resp

    # -- API -----------------------------------------------------------------------------------
    def livez(self) -> bool:
        """True when ``GET /livez`` answers 200."""
        return self._request("GET", "/livez").status_code == 200

    def display(self) -> dict[str, int]:
        """``{"width", "height", "depth"}`` of the guest screen (screen px, bits)."""
        return self._request("GET", "/v1/display").json()

    def actions(self, actions: Sequence[dict[str, Any]]) -> int:
        """Run Responses computer actions (screen px) in one request; returns ``executed``."""
        return int(self._request("POST", "/v1/actions", json={"actions": list(actions)}).json()["executed"])

    def screenshot(self, format: str = "png", quality: int | None = None, max_width: int | None = None,
                   max_height: int | None = None,
                   crop: tuple[int, int, int, int] | None = None) -> AgentScreenshot:
        """Capture the screen (optionally ``crop`` in screen px, bounded to max_width/max_height)."""
        params: dict[str, Any] = {"format": format}
        if quality is not None:
            params["quality"] = quality
        if max_width is not None:
            params["max_width"] = max_width
        if max_height is not None:
            params["max_height"] = max_height
        if crop is not None:
            params["crop"] = ",".join(str(int(v)) for v in crop)
        resp = self._request("GET", "/v1/screenshot", params=params)
        fx, fy, fw, fh = (int(v) for v in resp.headers["X-Frame"].split(","))
        return AgentScreenshot(
            data=resp.content,
            mime=resp.headers.get("content-type", ""),
            screen_size=_pair(resp.headers["X-Screen-Size"]),
            frame=(fx, fy, fw, fh),
            image_size=_pair(resp.headers["X-Image-Size"]),
        )

    def release(self) -> None:
        """Release every key and button the guest reports down."""
        self._request("POST", "/v1/release")

    def read_file(self, path: str) -> bytes:
        """Bytes of a guest file under the agent's allowed roots."""
        return self._request("GET", "/v1/files", params={"path": path}).content

    def launch(self, app: str, args: Sequence[str] = ()) -> int:
        """Start an allowlisted guest app with extra argv entries; returns its pid."""
        return int(self._request("POST", "/v1/launch", json={"app": app, "args": list(args)}).json()["pid"])
