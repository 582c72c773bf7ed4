"""The ``openai.OpenAI`` clients the runner uses, and per-request token usage.

- Offline: the real ``openai.OpenAI`` pointed at the scripted server, over an httpx transport that
  refuses any host that is not a loopback address (no DNS, no proxies from the environment), so an
  offline run can only ever reach 127.0.0.1/::1.
- Live: the real client with the API key from the environment.

Usage: ``ComputerToolset.run`` returns only the last response, so each response's ``usage`` is
read by an httpx response hook on the client's own HTTP client (:class:`UsageMeter`). A response
without usage makes the total incomplete, and the meter says so.
"""

from __future__ import annotations

import ipaddress
import json
import threading
from dataclasses import dataclass, field
from typing import Any, Callable

import httpx
import openai


class LoopbackOnlyTransport(httpx.HTTPTransport):
    """An httpx transport that raises ``httpx.ConnectError`` for any non-loopback IP literal host."""

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        host = request.url.host
        try:
            loopback = ipaddress.ip_address(host).is_loopback
        except ValueError:
            loopback = False  # names are refused: no DNS lookups in offline mode
        if not loopback:
            raise httpx.ConnectError(f"offline mode only reaches loopback addresses; refused {host!r}",
                                     request=request)
        return super().handle_request(request)


@dataclass
class RequestUsage:
    """One ``/responses`` request: response id, HTTP status, and token counts (None when absent)."""

    response_id: str | None
    status: int
    input_tokens: int | None
    output_tokens: int | None
    total_tokens: int | None


@dataclass
class UsageMeter:
    """Collects per-request usage from response bodies; ``on_request`` is called for each one."""

    on_request: Callable[[RequestUsage], None] | None = None
    requests: list[RequestUsage] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def hook(self, response: httpx.Response) -> None:
        """httpx ``response`` event hook for POST .../responses."""
        if response.request.method != "POST" or not response.request.url.path.endswith("/responses"):
            return
        response.read()
        body: Any = None
        try:
            body = json.loads(response.content)
        except (ValueError, UnicodeDecodeError):
            pass
        usage = body.get("usage") if isinstance(body, dict) else None

        def count(name: str) -> int | None:
            value = usage.get(name) if isinstance(usage, dict) else None
            return value if type(value) is int and value >= 0 else None

        item = RequestUsage(
            response_id=body.get("id") if isinstance(body, dict) else None,
            status=response.status_code,
            input_tokens=count("input_tokens"),
            output_tokens=count("output_tokens"),
            total_tokens=count("total_tokens"),
        )
        with self._lock:
            self.requests.append(item)
        if self.on_request is not None:
            self.on_request(item)

    def totals(self) -> dict[str, Any]:
        """Sums over successful requests; ``complete`` is False when any of them lacked usage."""
        ok = [r for r in self.requests if 200 <= r.status < 300]
        complete = all(r.total_tokens is not None for r in ok)
        return {
            "requests": len(ok),
            "input_tokens": sum(r.input_tokens or 0 for r in ok),
            "output_tokens": sum(r.output_tokens or 0 for r in ok),
            "total_tokens": sum(r.total_tokens or 0 for r in ok),
            "complete": complete,
            "missing": sum(1 for r in ok if r.total_tokens is None),
        }


def offline_client(base_url: str, meter: UsageMeter | None = None, *, timeout_s: float = 60.0) -> openai.OpenAI:
    """``openai.OpenAI`` for the scripted server at ``base_url`` (must be a loopback IP URL)."""
    host = httpx.URL(base_url).host
    if not ipaddress.ip_address(host).is_loopback:
        raise ValueError(f"offline base_url must be a loopback address, got {base_url}")
    hooks = {"response": [meter.hook]} if meter else {}
    http_client = httpx.Client(transport=LoopbackOnlyTransport(), trust_env=False, event_hooks=hooks,
                               timeout=timeout_s)
    return openai.OpenAI(api_key="offline-scripted", base_url=base_url, http_client=http_client, max_retries=0)


def live_client(meter: UsageMeter | None = None, *, timeout_s: float = 120.0) -> openai.OpenAI:
    """``openai.OpenAI`` for the live API; the key comes from ``OPENAI_API_KEY``."""
    hooks = {"response": [meter.hook]} if meter else {}
    http_client = httpx.Client(event_hooks=hooks, timeout=timeout_s)
    return openai.OpenAI(http_client=http_client)
