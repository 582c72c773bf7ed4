"""The ``openai.OpenAI`` clients the runner uses, and per-request token usage.

- Offline: the real ``openai.OpenAI`` pointed at the scripted server, over an httpx transport that
  refuses any host that is not a loopback address (no DNS, no proxies from the environment), so an
  offline run can only ever reach 127.0.0.1/::1.
- Live: the real client with the API key from the environment.
- Both stop with the run: given the run's ``stopping`` flag (a callable), a request in flight, its
  answer's body and the client's pause before a retry look at it every :data:`POLL_S` seconds and end
  with :class:`ModelRequestStopped` once it is true, never retried (a server that never answers
  cannot hold a cancelled run: the abandoned request ends at its own timeout in a daemon thread).

Usage: ``ComputerToolset.run`` returns only the last response, so each response's ``usage`` is
read by an httpx response hook on the client's own HTTP client (:class:`UsageMeter`). A response
without usage makes the total incomplete, and the meter says so.
"""

from __future__ import annotations

import ipaddress
import json
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, TypeVar

import httpx
import openai

T = TypeVar("T")

POLL_S = 0.1
"""How often a model request in flight (and a pause before a retry) looks at the run's ``stopping``
flag (seconds)."""


class ModelRequestStopped(openai.APIConnectionError):
    """A model request abandoned because the run is stopping (a signal, a cancel). An ``OpenAIError``:
    the client passes it on at once instead of retrying the request."""

    def __init__(self, request: Any) -> None:
        super().__init__(message="the run is stopping: the model request was abandoned", request=request)


def _until_stopped(work: Callable[[], T], stopping: Callable[[], bool], request: Any,
                   abandon: Callable[[T], None] = lambda _value: None) -> T:
    """``work()`` run in a daemon thread while this thread looks at ``stopping()`` every :data:`POLL_S`
    seconds: its result (or its exception), or :class:`ModelRequestStopped` once ``stopping()`` is true.
    What an abandoned ``work()`` returns later is passed to ``abandon`` (to close it)."""
    if stopping():
        raise ModelRequestStopped(request)
    box: dict[str, Any] = {}
    done = threading.Event()
    lock = threading.Lock()

    def run() -> None:
        try:
            value = work()
        except BaseException as exc:  # noqa: BLE001 - handed to the waiting thread
            box["error"] = exc
        else:
            with lock:
                if box.get("abandoned"):
                    abandon(value)
                    return
                box["value"] = value
        finally:
            done.set()

    threading.Thread(target=run, name="model-request", daemon=True).start()
    while not done.wait(POLL_S):  # poll interval: the flag is a plain attribute a signal handler sets
        if stopping():
            with lock:
                if "value" not in box and "error" not in box:
                    box["abandoned"] = True
                    raise ModelRequestStopped(request)
            break
    if "error" in box:
        raise box["error"]
    return box["value"]


class _StoppableStream(httpx.SyncByteStream):
    """A response body read chunk by chunk in :func:`_until_stopped`."""

    def __init__(self, inner: Any, stopping: Callable[[], bool], request: Any) -> None:
        self._inner, self._stopping, self._request = inner, stopping, request
        self._abandoned = False

    def __iter__(self) -> Iterator[bytes]:
        chunks = iter(self._inner)
        while True:
            try:
                chunk = _until_stopped(lambda: next(chunks, None), self._stopping, self._request)
            except ModelRequestStopped:
                self._abandoned = True  # a thread may still be reading it: it is left to its timeout
                raise
            if chunk is None:
                return
            yield chunk

    def close(self) -> None:
        if not self._abandoned:
            self._inner.close()


class StoppableTransport(httpx.BaseTransport):
    """A transport whose requests and response bodies stop with the run (module docstring)."""

    def __init__(self, inner: httpx.BaseTransport, stopping: Callable[[], bool]) -> None:
        self._inner, self._stopping = inner, stopping

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        response = _until_stopped(lambda: self._inner.handle_request(request), self._stopping, request,
                                  abandon=lambda late: late.close())
        return httpx.Response(status_code=response.status_code, headers=response.headers,
                              stream=_StoppableStream(response.stream, self._stopping, request),
                              extensions=response.extensions, request=request)

    def close(self) -> None:
        self._inner.close()


class _StoppableOpenAI(openai.OpenAI):
    """``openai.OpenAI`` whose pause before a retry ends with :class:`ModelRequestStopped` once the run
    is stopping."""

    stopping: Callable[[], bool] = staticmethod(lambda: False)

    def _sleep_for_retry(self, *, retries_taken: int, max_retries: int, options: Any, response: Any) -> None:
        timeout = self._calculate_retry_timeout(max_retries - retries_taken, options,
                                                response.headers if response is not None else None)
        deadline = time.monotonic() + timeout
        while (left := deadline - time.monotonic()) > 0:
            if self.stopping():
                raise ModelRequestStopped(response.request if response is not None
                                          else httpx.Request("POST", str(self.base_url)))
            time.sleep(min(POLL_S, left))  # the retry's pause, looking at the flag every POLL_S


def _stoppable(http_client: httpx.Client, stopping: Callable[[], bool] | None) -> httpx.Client:
    """``http_client`` with every transport it may use (its own and those its proxy settings mount)
    made a :class:`StoppableTransport` on ``stopping``; unchanged when ``stopping`` is None."""
    if stopping is None:
        return http_client
    http_client._transport = StoppableTransport(http_client._transport, stopping)
    http_client._mounts = {pattern: None if transport is None else StoppableTransport(transport, stopping)
                           for pattern, transport in http_client._mounts.items()}
    return http_client


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


def offline_client(base_url: str, meter: UsageMeter | None = None, *, api_key: str, timeout_s: float = 60.0,
                   stopping: Callable[[], bool] | None = None) -> openai.OpenAI:
    """``openai.OpenAI`` for the scripted server at ``base_url`` (must be a loopback IP URL; ValueError
    otherwise) with its key ``api_key`` (``ScriptedServer.key``); with ``stopping``, its requests end once
    ``stopping()`` is true (module docstring)."""
    host = httpx.URL(base_url).host
    if not ipaddress.ip_address(host).is_loopback:
        raise ValueError(f"offline base_url must be a loopback address, got {base_url}")
    hooks = {"response": [meter.hook]} if meter else {}
    http_client = _stoppable(httpx.Client(transport=LoopbackOnlyTransport(), trust_env=False, event_hooks=hooks,
                                          timeout=timeout_s), stopping)
    return openai.OpenAI(api_key=api_key, base_url=base_url, http_client=http_client, max_retries=0)


def live_client(meter: UsageMeter | None = None, *, timeout_s: float = 120.0,
                stopping: Callable[[], bool] | None = None) -> openai.OpenAI:
    """``openai.OpenAI`` for the live API; the key comes from ``OPENAI_API_KEY`` (the server from
    ``OPENAI_BASE_URL``). With ``stopping``, its requests and its pauses before a retry end once
    ``stopping()`` is true (module docstring)."""
    hooks = {"response": [meter.hook]} if meter else {}
    http_client = _stoppable(httpx.Client(event_hooks=hooks, timeout=timeout_s), stopping)
    if stopping is None:
        return openai.OpenAI(http_client=http_client)
    client = _StoppableOpenAI(http_client=http_client)
    client.stopping = stopping
    return client
