"""What a real browser cannot do to the console (Debian's chromium through Playwright): a page served by
another program on another 127.0.0.1 port, opened in the same browser as the logged-in person, tries
to approve, cancel and read; a browser without the session cookie opens the console's pages. Every
attempt is refused, and the registry and the run stay as they were."""

from __future__ import annotations

from tests.console.conftest import LIVE_ID, Runner


def test_another_local_site_in_the_same_browser_cannot_approve_cancel_or_read(browser, console, live, other_site):
    from playwright.sync_api import expect

    origin, pages, seen = other_site
    runner = Runner(live)
    runner.attach(None, (1280, 800))
    request = live.registry.open("safety_check", "Allow?", call_id="call_1",
                                 checks=[{"id": "sc", "code": "sensitive_action", "message": "m"}])
    context = browser.new_context()
    person = context.new_page()
    person.goto(console.url)  # the person is logged in: the browser holds the console's cookie
    assert person.url == console.base + "/"
    base = console.base + f"/runs/{LIVE_ID}"
    # cross-site form posts (a "simple" request: no preflight), each on its own page, sent on load
    pages["/form-approve"] = (f'<!doctype html><form method="POST" action="{base}/approvals/{request.id}" '
                              f'enctype="text/plain"><input name=\'{{"answer":"approve","x":"\' value=\'"}}\'></form>'
                              '<script>document.forms[0].submit()</script>')
    pages["/form-cancel"] = (f'<!doctype html><form method="POST" action="{base}/cancel"></form>'
                             '<script>document.forms[0].submit()</script>')
    pages["/attack"] = f"""<!doctype html><title>elsewhere</title>
<script>
(async () => {{
  const out = [];
  for (const [url, body] of [["{base}/approvals/{request.id}", '{{"answer":"approve"}}'], ["{base}/cancel", "{{}}"],
                             ["{base}/takeover", "{{}}"]]) {{
    try {{
      const r = await fetch(url, {{method: "POST", credentials: "include", mode: "no-cors",
                                   headers: {{"Content-Type": "text/plain"}}, body}});
      out.push("sent " + r.type);
    }} catch (e) {{ out.push("error " + e); }}
  }}
  try {{
    const r = await fetch("{base}/approvals", {{credentials: "include"}});
    out.push("read " + r.status);
  }} catch (e) {{ out.push("read blocked"); }}
  // what the other site can make the browser send to its own origin: the console's cookie never
  await fetch("/steal", {{credentials: "include"}}).catch(() => null);
  document.title = "done: " + out.join(", ");
}})();
</script>"""
    attacker = context.new_page()
    attacker.goto(origin + "/attack")
    attacker.wait_for_function("document.title.startsWith('done: ')")
    assert "read blocked" in attacker.title()  # no cross-origin read of the console
    for form in ("/form-approve", "/form-cancel"):
        posted = context.new_page()
        with posted.expect_response(lambda r: r.url.startswith(base)) as answer:
            posted.goto(origin + form)
        assert answer.value.status == 403, form  # refused: no Origin of the console's, no CSRF token
        posted.close()

    # nothing of it was approved, cancelled or taken over
    assert request.pending and live.state == "running" and runner.cancelled_by == []
    assert all(console.auth.cookie_name not in line for line in seen), seen
    # the person's own page still works: the same browser answers through the console's page
    person.goto(base)
    person.get_by_role("button", name="Deny").click()
    expect(person.locator(".card")).to_have_count(0)  # the console's CSP allows no eval: a locator waits
    assert request.state == "denied" and request.by == "console"
    context.close()


def test_a_browser_without_the_cookie_sees_nothing(browser, console, live):
    page = browser.new_page()
    for path in ("/", f"/runs/{LIVE_ID}", f"/runs/{LIVE_ID}/screen.jpg", f"/runs/{LIVE_ID}/approvals"):
        response = page.goto(console.base + path)
        assert response.status == 401, path
        assert "unauthenticated" in page.content()
    spent = page.goto(console.url)  # no use of the login link yet: it logs this browser in
    assert spent.status == 200 and page.url == console.base + "/"
    other = browser.new_page()  # a second browser profile: the link is spent
    assert other.goto(console.url).status == 403
    page.close()
    other.close()
