"""Task files: the shipped tasks load, and malformed ones are refused with the field named."""

from __future__ import annotations

from pathlib import Path

import pydantic
import pytest

from controller.tasks import FileCheck, SqliteCheck, load_task

TASKS = Path(__file__).resolve().parents[2] / "tasks"


def test_pickup_task_loads_with_its_checks_and_script():
    task = load_task(TASKS / "pickup.toml")
    assert task.name == "pickup" and (task.screen.width, task.screen.height) == (1280, 800)
    assert task.network.mode == "deny-all" and task.network.allow == []
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


@pytest.mark.parametrize("body, field", [
    ('name = "x"\ninstructions = "y"\nsurprise = 1\n', "surprise"),
    ('name = "x"\ninstructions = "y"\n[[checks]]\nkind = "file"\npath = "~/a"\nmatch = "glob"\nvalue = "*"\n', "match"),
    ('name = "x"\ninstructions = "y"\n[[checks]]\nkind = "ftp"\npath = "~/a"\n', "kind"),
    ('name = "x"\ninstructions = "y"\n[network]\nmode = "deny-all"\nallow = ["https://a.example"]\n', "allow"),
    ('name = "x"\ninstructions = "y"\n[model]\ncrop = [0, 0, 0, 10]\n', "crop"),
    ('instructions = "y"\n', "name"),
])
def test_malformed_tasks_are_refused(tmp_path, body, field):
    with pytest.raises(pydantic.ValidationError, match=field):
        load_task(_write(tmp_path, body))


def test_defaults(tmp_path):
    task = load_task(_write(tmp_path, 'name = "x"\ninstructions = "y"\n'))
    assert task.max_steps == 20 and task.model.max_width == 1280 and task.checks == []
    with pytest.raises(ValueError, match="no \\[offline\\]"):
        task.offline_script_path()
