"""The agent client's transport: one deadline per call, enforced at the socket.

:class:`DeadlineTransport` is an ``httpx`` transport over ``httpcore`` whose every connect, read and
write waits at most the time left before the deadline of the call running in the same thread
(:class:`Deadlines`, ``time.monotonic()`` seconds). A peer that trickles one byte just inside each
read timeout, or stalls mid-answer, is cut off at the deadline instead of resetting a per-read timer.
Timeouts surface as ``httpx`` timeout errors; :class:`controller.agent_client.AgentClient` turns them
into ``AgentError`` code ``deadline`` (the rule: ARCHITECTURE.md, contract 1).
"""

from __future__ import annotations

import contextlib
import threading
import time
from typing import Any, Iterator

import httpcore
import httpx

class Deadlines:
    """The deadline (``time.monotonic()`` seconds) of the call running in each thread, if any."""

    def __init__(self) -> None:
        self._local = threading.local()

    @contextlib.contextmanager
    def until(self, deadline: float) -> Iterator[None]:
        previous = getattr(self._local, "deadline", None)
        self._local.deadline = deadline
        try:
            yield
        finally:
            self._local.deadline = previous

    def clamp(self, timeout: float | None, expired: type[Exception]) -> float | None:
        """``timeout`` shortened to the time left; raises ``expired`` when none is left."""
        deadline = getattr(self._local, "deadline", None)
        if deadline is None:
            return timeout
        left = deadline - time.monotonic()
        if left <= 0:
            raise expired("the call's deadline has passed")
        return left if timeout is None else min(timeout, left)


class _DeadlineStream(httpcore.NetworkStream):
    def __init__(self, stream: httpcore.NetworkStream, deadlines: Deadlines) -> None:
        self._stream, self._deadlines = stream, deadlines

    def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        return self._stream.read(max_bytes, self._deadlines.clamp(timeout, httpcore.ReadTimeout))

    def write(self, buffer: bytes, timeout: float | None = None) -> None:
        self._stream.write(buffer, self._deadlines.clamp(timeout, httpcore.WriteTimeout))

    def close(self) -> None:
        self._stream.close()

    def start_tls(self, ssl_context: Any, server_hostname: str | None = None,
                  timeout: float | None = None) -> httpcore.NetworkStream:
        stream = self._stream.start_tls(ssl_context, server_hostname,
                                        self._deadlines.clamp(timeout, httpcore.ConnectTimeout))
        return _DeadlineStream(stream, self._deadlines)

    def get_extra_info(self, info: str) -> Any:
        return self._stream.get_extra_info(info)


class DeadlineBackend(httpcore.NetworkBackend):
    """httpcore's plain sockets, each connect and every later read and write bounded by the calling
    thread's deadline in ``deadlines`` (for an ``httpcore.ConnectionPool``; also the gateway control
    client's, :mod:`controller.run.origins`)."""

    def __init__(self, deadlines: Deadlines) -> None:
        self._inner, self._deadlines = httpcore.SyncBackend(), deadlines

    def connect_tcp(self, host: str, port: int, timeout: float | None = None, local_address: str | None = None,
                    socket_options: Any = None) -> httpcore.NetworkStream:
        stream = self._inner.connect_tcp(host, port, self._deadlines.clamp(timeout, httpcore.ConnectTimeout),
                                         local_address, socket_options)
        return _DeadlineStream(stream, self._deadlines)

    def connect_unix_socket(self, path: str, timeout: float | None = None,
                            socket_options: Any = None) -> httpcore.NetworkStream:
        stream = self._inner.connect_unix_socket(path, self._deadlines.clamp(timeout, httpcore.ConnectTimeout),
                                                 socket_options)
        return _DeadlineStream(stream, self._deadlines)

    def sleep(self, seconds: float) -> None:
        self._inner.sleep(seconds)


# httpcore's transport errors and the httpx ones they become, most specific first (isinstance order).
_HTTPX_ERRORS: tuple[tuple[type[Exception], type[httpx.TransportError]], ...] = (
    (httpcore.ConnectTimeout, httpx.ConnectTimeout),
    (httpcore.ReadTimeout, httpx.ReadTimeout),
    (httpcore.WriteTimeout, httpx.WriteTimeout),
    (httpcore.PoolTimeout, httpx.PoolTimeout),
    (httpcore.TimeoutException, httpx.TimeoutException),
    (httpcore.ConnectError, httpx.ConnectError),
    (httpcore.ReadError, httpx.ReadError),
    (httpcore.WriteError, httpx.WriteError),
    (httpcore.NetworkError, httpx.NetworkError),
    (httpcore.RemoteProtocolError, httpx.RemoteProtocolError),
    (httpcore.LocalProtocolError, httpx.LocalProtocolError),
    (httpcore.ProtocolError, httpx.ProtocolError),
    (httpcore.UnsupportedProtocol, httpx.UnsupportedProtocol),
    (httpcore.ProxyError, httpx.ProxyError),
)


def _to_httpx(exc: Exception) -> httpx.TransportError:
    """The httpx error matching httpcore's ``exc`` by class (ReadTimeout -> httpx.ReadTimeout, ...);
    ``httpx.TransportError`` for anything else."""
    for core, mapped in _HTTPX_ERRORS:
        if isinstance(exc, core):
            return mapped(str(exc))
    return httpx.TransportError(str(exc))


class _CoreBody(httpx.SyncByteStream):
    def __init__(self, stream: Any) -> None:
        self._stream = stream

    def __iter__(self) -> Iterator[bytes]:
        try:
            yield from self._stream
        except httpcore.TimeoutException as exc:
            raise _to_httpx(exc) from exc
        except (httpcore.NetworkError, httpcore.ProtocolError) as exc:
            raise _to_httpx(exc) from exc

    def close(self) -> None:
        close = getattr(self._stream, "close", None)
        if close is not None:
            close()


class DeadlineTransport(httpx.BaseTransport):
    """An HTTP/1.1 transport (httpcore's pool, no proxies from the environment) whose every socket
    operation is bounded by the calling thread's deadline in ``deadlines``."""

    def __init__(self, deadlines: Deadlines) -> None:
        self._pool = httpcore.ConnectionPool(network_backend=DeadlineBackend(deadlines), max_connections=16,
                                             max_keepalive_connections=8, keepalive_expiry=5.0)

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        req = httpcore.Request(
            method=request.method,
            url=httpcore.URL(scheme=request.url.raw_scheme, host=request.url.raw_host, port=request.url.port,
                             target=request.url.raw_path),
            headers=request.headers.raw, content=request.stream, extensions=request.extensions,
        )
        try:
            resp = self._pool.handle_request(req)
        except (httpcore.TimeoutException, httpcore.NetworkError, httpcore.ProtocolError) as exc:
            raise _to_httpx(exc) from exc
        return httpx.Response(status_code=resp.status, headers=resp.headers, stream=_CoreBody(resp.stream),
                              extensions=resp.extensions)

    def close(self) -> None:
        self._pool.close()
