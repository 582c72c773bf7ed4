"""A client that is killed in the middle of a call (tests/mcp/test_mcp_client_killed_docker.py runs it).

``python -m tests.mcp._killed_client SERVER-ARGS...`` spawns ``desktop-sandbox mcp SERVER-ARGS`` over stdio
with the ``mcp`` package's client, takes a screenshot, moves the pointer, and then clicks: the server asks
about the click by elicitation and this client never answers; it prints ``ASKED`` on stdout when the
question arrives and waits to be killed. The server's stderr is this process's.
"""

from __future__ import annotations

import sys

import anyio


async def main(args: list[str]) -> None:
    from mcp import Client

    from tests.mcp._client import stdio_params

    async def never_answer(_ctx, _params):  # noqa: ANN001, ANN202
        print("ASKED", flush=True)
        await anyio.sleep_forever()

    async with Client(stdio_params(*args), elicitation_callback=never_answer) as client:
        shot = await client.call_tool("screenshot", {})
        print("SHOT", shot.is_error, flush=True)
        moved = await client.call_tool("move", {"x": 640, "y": 400})
        print("MOVED", moved.is_error, flush=True)
        await client.call_tool("click", {"x": 320, "y": 200})
        print("CLICK RETURNED", flush=True)  # never: the process is killed while the click waits


if __name__ == "__main__":
    anyio.run(main, sys.argv[1:])
