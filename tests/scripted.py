"""Clients of a started :class:`controller.offline.scripted_server.ScriptedServer` that carry its key, as
the runner's do: the offline ``openai.OpenAI``, the Agent Framework ``AsyncOpenAI``, and a raw
``POST /v1/responses`` (for bodies no SDK would send)."""

from __future__ import annotations

from typing import Any

import httpx


def auth(server: Any) -> dict[str, str]:
    """The ``Authorization`` header the server admits."""
    return {"Authorization": f"Bearer {server.key}"}


def client(server: Any, meter: Any = None, **options: Any) -> Any:
    """:func:`controller.run.model_client.offline_client` for ``server`` (``options``: its keywords)."""
    from controller.run.model_client import offline_client

    return offline_client(server.base_url, meter, api_key=server.key, **options)


def async_client(server: Any, meter: Any = None, **options: Any) -> Any:
    """:func:`controller.af.loop.async_client` for ``server`` (``options``: its keywords)."""
    from controller.af.loop import async_client as make

    return make(server.base_url, meter, api_key=server.key, **options)


def post(server: Any, body: Any = None, *, content: bytes | None = None, headers: dict[str, str] | None = None,
         timeout: float = 10.0) -> httpx.Response:
    """``POST /v1/responses`` to ``server`` with its key: ``body`` as JSON, or ``content`` as is;
    ``headers`` are added (and may replace ``Authorization``)."""
    sent = {**auth(server), **(headers or {})}
    if content is not None:
        return httpx.post(f"{server.base_url}/responses", content=content, headers=sent, timeout=timeout)
    return httpx.post(f"{server.base_url}/responses", json=body, headers=sent, timeout=timeout)
