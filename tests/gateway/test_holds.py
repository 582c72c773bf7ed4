"""The origin-request book and the control API's access rules, without a proxy (asyncio, ASGI in process)."""

from __future__ import annotations

import asyncio
import ipaddress

import pytest

from controller.gateway.holds import EVENT_BUFFER, AnswerRefused, OriginRequests
from controller.gateway.policy import Origin

A = Origin.parse("https://a.test")
B = Origin.parse("https://b.test")


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, 10))


def test_one_request_per_origin_and_every_connection_gets_the_answer():
    async def scenario():
        book = OriginRequests(hold_timeout=10, max_pending=3)
        tickets = [book.join(A, "CONNECT", f"c{n}") for n in range(5)]
        assert len({t.request.id for t in tickets}) == 1
        [request] = book.listing()
        assert request["held"] == 5 and request["via"] == "CONNECT"
        assert book.answer(request["id"], "approve", "terminal") is True
        outcomes = [await t.wait() for t in tickets]
        assert {(o.state, o.request_id) for o in outcomes} == {("approved", request["id"])}
        assert book.memory(A) == ("approved", request["id"])
        assert book.answer(request["id"], "approve", "console") is False  # identical: nothing changes
        with pytest.raises(AnswerRefused) as refused:
            book.answer(request["id"], "deny", "console")
        assert refused.value.code == "already_decided"
        assert book.get(request["id"]).by == "terminal"
        assert [name for _seq, name, _data in book.events_after(0)] == ["created", "resolved"]

    run(scenario())


def test_cancel_is_not_remembered_and_timeout_expires():
    async def scenario():
        book = OriginRequests(hold_timeout=0.05, max_pending=3)
        first = book.join(A, "http", "c1")
        book.answer(first.request.id, "cancel", "t")
        assert (await first.wait()).state == "cancelled" and book.memory(A) is None
        second = book.join(A, "http", "c2")
        assert second.request.id != first.request.id
        outcome = await second.wait()
        assert outcome.state == "timeout" and outcome.held_ms >= 40 and book.memory(A) is None
        with pytest.raises(AnswerRefused) as refused:
            book.answer(second.request.id, "approve", "t")
        assert refused.value.code == "expired"
        with pytest.raises(AnswerRefused) as unknown:
            book.answer("oreq_missing", "approve", "t")
        assert unknown.value.code == "unknown_request"

    run(scenario())


def test_prompt_limit_counts_origins_not_connections_and_gone_clients_leave_it_pending():
    async def scenario():
        book = OriginRequests(hold_timeout=10, max_pending=1)
        a1 = book.join(A, "CONNECT", "c1")
        assert book.join(B, "CONNECT", "c2") is None
        a2 = book.join(A, "CONNECT", "c3")
        assert book.client_gone("c1") == 1
        assert (await a1.wait()).state == "client_gone"
        [request] = book.listing()
        assert request["held"] == 1 and request["state"] == "pending"
        book.answer(request["id"], "deny", "t")
        assert (await a2.wait()).state == "denied" and book.memory(A) == ("denied", request["id"])

    run(scenario())


def test_events_replay_from_the_ring_until_it_has_moved_on():
    async def scenario():
        book = OriginRequests(hold_timeout=10, max_pending=EVENT_BUFFER)
        for n in range(EVENT_BUFFER // 2 + 1):
            ticket = book.join(Origin.parse(f"https://h{n}.test"), "CONNECT", f"c{n}")
            book.answer(ticket.request.id, "deny", "t")
        assert book.seq == EVENT_BUFFER + 2
        assert book.events_after(book.seq) == []
        assert [seq for seq, _n, _d in book.events_after(book.seq - 3)] == [book.seq - 2, book.seq - 1, book.seq]
        assert book.events_after(1) is None  # older than the buffer: snapshot
        assert book.events_after(book.seq + 1) is None  # never given: snapshot
        assert book.events_after(2) is not None

    run(scenario())


def test_the_control_api_refuses_the_guests_network_and_wrong_tokens():
    httpx = pytest.importorskip("httpx")
    pytest.importorskip("fastapi")
    from controller.gateway.control import make_app

    async def scenario():
        book = OriginRequests(hold_timeout=10, max_pending=3)
        app = make_app(book, "secret-token", [ipaddress.ip_network("172.30.0.0/16")])
        good = {"Authorization": "Bearer secret-token"}
        for client, headers, status in [
            (("172.30.0.5", 4000), good, 403), (("::ffff:172.30.9.9", 4000), good, 403),
            (("127.0.0.1", 4000), good, 200), (("172.31.0.5", 4000), good, 200),
            (("127.0.0.1", 4000), {}, 401), (("127.0.0.1", 4000), {"Authorization": "Bearer secret-tokeN"}, 401),
        ]:
            transport = httpx.ASGITransport(app=app, client=client)
            async with httpx.AsyncClient(transport=transport, base_url="http://control") as http:
                response = await http.get("/v1/origin-requests", headers=headers)
            assert response.status_code == status, (client, headers)
            if status != 200:
                assert set(response.json()["error"]) == {"code", "message"}

    run(scenario())
