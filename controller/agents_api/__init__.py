"""A local Agents API: the openai SDK's ``client.beta.agents.sessions`` over this appliance's sandboxes.

``desktop-sandbox serve`` (:mod:`server`) serves, on 127.0.0.1 with a bearer key, the part of the
hosted Agents API that the hosted-browser samples use -- sessions create / retrieve / list / delete,
their input events, their event stream (SSE, ``Last-Event-ID``) and their items -- in the SDK's own
shapes, so a program written for ``OpenAI()`` runs with ``OpenAI(base_url=..., api_key=...)``.

One concern a module: :mod:`requests` (what a request may say), :mod:`shapes` (what the answers look
like), :mod:`store` (SQLite), :mod:`sessions` (a session: its sandbox, turns, approvals and events),
:mod:`app` (the routes), :mod:`server` (key file, uvicorn, start and stop), :mod:`bench`. The contract:
docs/ARCHITECTURE.md, "Contract 7".
"""
