"""Task files: the shipped tasks load, and malformed ones are refused with the field named."""

from __future__ import annotations

from pathlib import Path

import pytest

from controller.run.tasks import FileCheck, SqliteCheck, TaskError, load_task

TASKS = Path(__file__).resolve().parents[2] / "tasks"


def test_pickup_task_loads_with_its_checks_and_script():
    task = load_task(TASKS / "pickup.toml")
    assert task.name == "pickup" and (task.screen.width, task.screen.height) == (1280, 800)
    assert task.network.mode == "deny-all" and list(task.network.allow) == []
    kinds = [type(c) for c in task.checks]
    assert kinds == [SqliteCheck, FileCheck, SqliteCheck]
    assert task.checks[2].bind_files == ["~/Documents/pickup.txt"]
    assert task.offline_script_path().is_file()
    assert [launch.app for launch in task.launch] == ["terminal", "browser"]


def test_approval_demo_task_loads():
    task = load_task(TASKS / "approval-demo.toml")
    assert task.offline_script_path().is_file()


def _write(tmp_path, text):
    path = tmp_path / "t.toml"
    path.write_text(text)
    return path


BASE = 'name = "x"\ninstructions = "y"\n'
CHECK = '[[checks]]\nkind = "file"\npath = "~/a"\nmatch = "text"\nvalue = "a"\n'


def _file_check(match: str, value: str, path: str = '"~/a"') -> str:
    return f'[[checks]]\nkind = "file"\npath = {path}\nmatch = "{match}"\nvalue = {value}\n'


def _sqlite_check(query: str, extra: str = "") -> str:
    return f'[[checks]]\nkind = "sqlite"\npath = "~/db"\nquery = "{query}"\nrows = [[1]]\n{extra}'


@pytest.mark.parametrize("body, field", [
    (BASE + CHECK + 'surprise = 1\n', "surprise"),
    (BASE + _file_check("glob", '"*"'), "match"),
    (BASE + '[[checks]]\nkind = "ftp"\npath = "~/a"\n', "kind"),
    (BASE + CHECK + '[network]\nmode = "deny-all"\nallow = ["https://a.example"]\n', "allow"),
    (BASE + CHECK + '[model]\ncrop = [0, 0, 0, 10]\n', "crop"),
    ('instructions = "y"\n' + CHECK, "name"),
    # a typo of the checks table must not silently drop the checks
    (BASE + CHECK.replace("[[checks]]", "[[check]]"), "check"),
    (BASE + CHECK.replace("[[checks]]", "[[Checks]]"), "Checks"),
    # a task without checks can never be verified: refused, rather than counted as passed
    (BASE, "checks"),
    (BASE + "checks = []\n", "checks"),
    ('name = ""\ninstructions = "y"\n' + CHECK, "name"),
    ('name = "x"\ninstructions = "  \\n "\n' + CHECK, "instructions"),
    # wrong types are refused, not coerced
    (BASE + CHECK + '[screen]\nwidth = "1280"\n', "screen.width"),
    (BASE + CHECK + '[screen]\nwidth = 1280.0\n', "screen.width"),
    (BASE + CHECK + '[screen]\nheight = true\n', "screen.height"),
    (BASE + CHECK + '[screen]\nwidth = -1280\n', "screen.width"),
    (BASE + CHECK + '[screen]\nwidth = 100000\n', "screen.width"),
    (BASE + CHECK + '[model]\nmax_width = "640"\n', "model.max_width"),
    (BASE + CHECK + 'max_steps = true\n', "max_steps"),
    (BASE + CHECK + 'max_steps = "5"\n', "max_steps"),
    # the crop must lie inside the screen
    (BASE + CHECK + '[model]\ncrop = [1200, 700, 200, 200]\n', "crop"),
    (BASE + CHECK + '[screen]\nwidth = 800\nheight = 600\n[model]\ncrop = [0, 0, 801, 600]\n', "crop"),
    # origins are parsed by the gateway's rules, not stored as strings
    (BASE + CHECK + '[network]\nmode = "allowlist"\nallow = ["https://example.com/path"]\n', "network.allow"),
    (BASE + CHECK + '[network]\nmode = "allowlist"\nallow = ["https://example.com?q=1"]\n', "network.allow"),
    (BASE + CHECK + '[network]\nmode = "allowlist"\nallow = ["https://user@example.com"]\n', "network.allow"),
    (BASE + CHECK + '[network]\nmode = "allowlist"\nallow = ["https://*.example.com"]\n', "network.allow"),
    (BASE + CHECK + '[network]\nmode = "allowlist"\nallow = ["https://"]\n', "network.allow"),
    (BASE + CHECK + '[network]\nmode = "allowlist"\nallow = ["ftp://example.com"]\n', "network.allow"),
    (BASE + CHECK + '[network]\nmode = "allowlist"\nallow = ["example.com"]\n', "network.allow"),
    (BASE + CHECK + '[network]\nmode = "allowlist"\nallow = ["https://::1"]\n', "network.allow"),
    (BASE + CHECK + '[network]\nmode = "allowlist"\nallow = "https://example.com"\n', "network.allow"),
    (BASE + CHECK + '[network]\nmode = "denyall"\n', "network.mode"),
    # file check values: strings for exact/text/regex, a compiling regex, valid JSON text
    (BASE + _file_check("regex", '"(["'), "value"),
    (BASE + _file_check("regex", "5"), "value"),
    (BASE + _file_check("text", "5"), "value"),
    (BASE + _file_check("exact", "[1, 2]"), "value"),
    (BASE + _file_check("json", '"{not json"'), "value"),
    # guest paths: absolute or ~/..., no .. segments
    (BASE + _file_check("text", '"a"', path='"Documents/a.txt"'), "path"),
    (BASE + _file_check("text", '"a"', path='"~/../../etc/passwd"'), "path"),
    (BASE + _file_check("text", '"a"', path='"/home/sandbox/x/../../../etc/shadow"'), "path"),
    (BASE + _file_check("text", '"a"', path='"~root/.bashrc"'), "path"),
    (BASE + _file_check("text", '"a"', path='""'), "path"),
    (BASE + _sqlite_check("SELECT ?", 'bind_files = ["notes.txt"]\n'), "bind_files"),
    (BASE + CHECK + '[[ready]]\nfile = "ready-flag"\n', "ready"),
    # sqlite checks only read: one SELECT, WITH or VALUES statement
    (BASE + _sqlite_check("DELETE FROM pickups"), "query"),
    (BASE + _sqlite_check("UPDATE t SET x = 1"), "query"),
    (BASE + _sqlite_check("ATTACH 'x.db' AS y"), "query"),
    (BASE + _sqlite_check("PRAGMA writable_schema = 1"), "query"),
    (BASE + _sqlite_check("SELECT 1; DROP TABLE t"), "query"),
    (BASE + _sqlite_check(""), "query"),
    (BASE + CHECK + '[offline]\nscript = ""\n', "offline.script"),
    # the file's origin is set by the loader, never by the file
    (BASE + CHECK + 'source = "/etc/passwd"\n', "source"),
])
def test_malformed_tasks_are_refused(tmp_path, body, field):
    path = _write(tmp_path, body)
    with pytest.raises(TaskError, match=field) as info:
        load_task(path)
    message = str(info.value)
    assert "\n" not in message and message.startswith(f"{path}: ")
    assert isinstance(info.value, ValueError)


def test_error_names_the_value_that_was_refused(tmp_path):
    with pytest.raises(TaskError) as info:
        load_task(_write(tmp_path, BASE + CHECK + '[network]\nmode = "denyall"\n'))
    assert "'denyall'" in str(info.value)


@pytest.mark.parametrize("body, where", [
    (BASE + "[[checks\n", "line 3"),
    ("name = \"x\n", "line 1"),
    (b"name = \"\xff\"\n", "UTF-8"),
])
def test_unreadable_task_files_are_task_errors(tmp_path, body, where):
    path = tmp_path / "t.toml"
    path.write_bytes(body if isinstance(body, bytes) else body.encode())
    with pytest.raises(TaskError, match=where) as info:
        load_task(path)
    assert "\n" not in str(info.value)
    with pytest.raises(TaskError, match="cannot read"):
        load_task(tmp_path / "missing.toml")
    with pytest.raises(TaskError, match="cannot read"):
        load_task(tmp_path)


def test_accepted_spellings_are_canonical(tmp_path):
    task = load_task(_write(tmp_path, BASE + CHECK + '[network]\nmode = "allowlist"\n'
                            'allow = ["HTTPS://Bücher.Example:443/", "http://[::1]:8080"]\n'
                            '[model]\nmax_width = 4000\ncrop = [0, 0, 1280, 800]\n'))
    assert list(task.network.allow) == ["https://xn--bcher-kva.example", "http://[::1]:8080"]
    assert task.model.max_width == 4000  # larger than the screen: never up-scaled, so harmless
    assert task.network.model_dump(mode="json")["allow"] == ["https://xn--bcher-kva.example", "http://[::1]:8080"]


def test_sqlite_with_clause_and_comments_are_reads(tmp_path):
    task = load_task(_write(tmp_path, BASE + _sqlite_check("  -- count\\n WITH x AS (SELECT 1) SELECT * FROM x;")))
    assert task.checks[0].query.strip().endswith("FROM x;")


def test_json_check_value_with_a_duplicate_key_is_refused(tmp_path):
    with pytest.raises(TaskError, match="duplicate key 'a'"):
        load_task(_write(tmp_path, BASE + _file_check("json", "'{\"a\": 1, \"a\": 2}'")))


def test_sqlite_values_is_a_read_and_the_refusal_names_all_three(tmp_path):
    task = load_task(_write(tmp_path, BASE + _sqlite_check("VALUES (1)")))
    assert task.checks[0].query == "VALUES (1)"
    with pytest.raises(TaskError, match="one SELECT, WITH or VALUES statement"):
        load_task(_write(tmp_path, BASE + _sqlite_check("INSERT INTO t VALUES (1)")))


def test_defaults(tmp_path):
    task = load_task(_write(tmp_path, BASE + CHECK))
    assert task.max_steps == 20 and task.model.max_width == 1280 and len(task.checks) == 1
    with pytest.raises(ValueError, match="no \\[offline\\]"):
        task.offline_script_path()


def test_a_task_that_is_a_fifo_or_holds_a_huge_integer_is_refused_in_one_line(tmp_path):
    import os

    fifo = tmp_path / "fifo.toml"
    os.mkfifo(fifo)
    with pytest.raises(TaskError, match="fifo.toml: cannot read: .*not a regular file"):
        load_task(fifo)
    with pytest.raises(TaskError, match="big.toml: "):
        big = tmp_path / "big.toml"
        big.write_text(BASE + CHECK + "max_steps = 1" + "0" * 5000 + "\n")
        load_task(big)


# -- contract 8: page checks, [signin], the browser channel -----------------------------------------
def _page_check(url: str = '"http://signin-demo:8080/session"', match: str = "text", value: str = '"ok"') -> str:
    return f'[[checks]]\nkind = "page"\nurl = {url}\nmatch = "{match}"\nvalue = {value}\n'


def test_sign_in_demo_task_loads_with_a_page_check_and_the_browser_channel():
    from controller.run.tasks import PageCheck

    task = load_task(TASKS / "sign-in-demo.toml")
    assert task.signin.enabled and task.browser_channel
    [check] = task.checks
    assert isinstance(check, PageCheck) and check.url == "http://signin-demo:8080/session"
    spec = task.sandbox_spec(ready_timeout=5.0)
    assert spec.browser_channel and spec.ready_timeout == 5.0
    assert (spec.screen_width, spec.screen_height) == (task.screen.width, task.screen.height)
    assert spec.policy["allow"] == ["http://signin-demo:8080"]


def test_signin_defaults_on_and_the_channel_follows_the_launch(tmp_path):
    task = load_task(_write(tmp_path, BASE + CHECK))
    assert task.signin.enabled and not task.browser_channel and not task.sandbox_spec().browser_channel
    task = load_task(_write(tmp_path, BASE + CHECK + '[signin]\nenabled = false\n'
                            '[[launch]]\napp = "terminal"\n[[launch]]\napp = "chromium"\nargs = ["about:blank"]\n'))
    assert not task.signin.enabled and task.browser_channel and task.sandbox_spec().browser_channel


@pytest.mark.parametrize("body, field", [
    (BASE + _page_check(url='"ftp://a.example/x"'), "url"),
    (BASE + _page_check(url='"http://a.example/x#frag"'), "url"),
    (BASE + _page_check(url='"http://a.example/a b"'), "url"),
    (BASE + _page_check(url='"file:///etc/passwd"'), "url"),
    (BASE + _page_check(url=f'"http://a.example/{"x" * 2048}"'), "url"),
    (BASE + _page_check(match="exact"), "match"),
    (BASE + _page_check(match="regex", value='"("'), "regex"),
    (BASE + _page_check(match="json", value='"{not json"'), "JSON"),
    (BASE + _page_check() + 'extra = 1\n', "extra"),
    (BASE + CHECK + '[signin]\nenabled = "yes"\n', "enabled"),
    (BASE + CHECK + '[signin]\nenabled = true\nfile = "creds.toml"\n', "file"),
])
def test_malformed_page_checks_and_signin_tables_are_refused(tmp_path, body, field):
    path = _write(tmp_path, body)
    with pytest.raises(TaskError, match=field) as info:
        load_task(path)
    assert "\n" not in str(info.value)


def test_page_check_accepts_http_and_https_with_path_and_query(tmp_path):
    for url in ('"http://signin-demo:8080"', '"https://a.example/p?q=1&r=2"', '"http://10.0.0.1/x/y"'):
        task = load_task(_write(tmp_path, BASE + _page_check(url=url, match="json", value='{ "a" = 1 }')))
        assert task.checks[0].url == url.strip('"')


CHROMIUM = '[[launch]]\napp = "chromium"\nargs = ["http://127.0.0.1:8080/"]\n'


def test_browser_pickup_task_gives_the_model_the_browser_tools_only():
    from openai.lib.browser import DEFAULT_BROWSER_MEMBERS

    task = load_task(TASKS / "browser-pickup.toml")
    assert task.model.tools == ["browser"] and task.browser_tools and not task.computer_tools
    assert task.browser_channel and task.offline_script_path().is_file()
    assert task.browser_members == tuple(DEFAULT_BROWSER_MEMBERS)  # none named: the SDK's defaults


def test_tools_default_to_the_computer_and_members_are_taken_as_named(tmp_path):
    plain = load_task(_write(tmp_path, BASE + CHECK))
    assert plain.model.tools == ["computer"] and plain.computer_tools and not plain.browser_tools
    both = load_task(_write(tmp_path, BASE + '[model]\ntools = ["computer", "browser"]\n'
                            'browser_members = ["read_page", "click_at", "list_tabs"]\n' + CHROMIUM + CHECK))
    assert both.computer_tools and both.browser_tools
    assert both.browser_members == ("read_page", "click_at", "list_tabs")  # an explicit-only member opts in


@pytest.mark.parametrize("body, field, why", [
    (BASE + '[model]\ntools = ["browser"]\n' + CHECK, "model.tools", "must launch it"),
    (BASE + '[model]\ntools = []\n' + CHROMIUM + CHECK, "model.tools", "at least 1"),
    (BASE + '[model]\ntools = ["pixels"]\n' + CHECK, "model.tools", "computer"),
    (BASE + '[model]\ntools = ["browser", "browser"]\n' + CHROMIUM + CHECK, "model.tools", "once"),
    (BASE + '[model]\ntools = "browser"\n' + CHROMIUM + CHECK, "model.tools", "list"),
    (BASE + '[model]\nbrowser_members = ["click"]\n' + CHROMIUM + CHECK, "model", 'needs "browser"'),
    (BASE + '[model]\ntools = ["browser"]\nbrowser_members = ["run_script"]\n' + CHROMIUM + CHECK,
     "model.browser_members", "not served by the guest agent"),
    (BASE + '[model]\ntools = ["browser"]\nbrowser_members = ["teleport"]\n' + CHROMIUM + CHECK,
     "model.browser_members", "not a member of the SDK's BrowserToolset"),
    (BASE + '[model]\ntools = ["browser"]\nbrowser_members = ["click", "click"]\n' + CHROMIUM + CHECK,
     "model.browser_members", "once"),
    (BASE + '[model]\ntools = ["browser"]\nbrowser_members = []\n' + CHROMIUM + CHECK,
     "model.browser_members", "at least 1"),
    (BASE + '[model]\ntools = ["browser"]\nbrowser_members = [1]\n' + CHROMIUM + CHECK,
     "model.browser_members", "string"),
])
def test_malformed_browser_tool_settings_are_refused_with_the_field(tmp_path, body, field, why):
    with pytest.raises(TaskError) as err:
        load_task(_write(tmp_path, body))
    message = str(err.value)
    assert "\n" not in message and f"{field}" in message and why in message, message
