"""``GET /v1/files`` under a racing swapper: a process in the guest swaps a directory on the requested
path for a symbolic link to a directory outside the roots while the agent reads. No read may return
the outside file (guest/files.py opens every component without following links)."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import pytest

from guest.files import FileError, FileReader

SWAPS_AT_LEAST = 2000  # swaps of the directory for the link seen during the reads
DEADLINE_S = 20.0


def _swapper(race: Path, stop: threading.Event, swaps: list[int]) -> None:
    """Alternates ``race/sub`` between the real entry inside (kept as ``sub.real``) and a link to the
    outside (kept as ``sub.lnk``), with renames, until ``stop``."""
    sub, real, link = race / "sub", race / "sub.real", race / "sub.lnk"
    while not stop.is_set():
        os.rename(real, sub)
        os.rename(sub, real)
        os.rename(link, sub)
        os.rename(sub, link)
        swaps[0] += 1


@pytest.mark.parametrize("through", ["directory", "file"])
def test_a_swapped_directory_never_leads_outside_the_roots(tmp_path, through):
    home, outside = tmp_path / "home", tmp_path / "outside"
    (home / "race").mkdir(parents=True)
    outside.mkdir()
    if through == "directory":  # race/sub is a directory holding passwd, or a link to the outside one
        (home / "race" / "sub.real").mkdir()
        (home / "race" / "sub.real" / "passwd").write_text("inside")
    else:  # race/sub is the file itself, or a link to the outside file
        (home / "race" / "sub.real").write_text("inside")
    (outside / "passwd").write_text("SECRET outside the roots")
    target = outside if through == "directory" else outside / "passwd"
    (home / "race" / "sub.lnk").symlink_to(target, target_is_directory=through == "directory")
    reader = FileReader([str(home)])

    stop, swaps = threading.Event(), [0]
    thread = threading.Thread(target=_swapper, args=(home / "race", stop, swaps), daemon=True)
    thread.start()
    outcomes: dict[str, int] = {}
    deadline = time.monotonic() + DEADLINE_S
    try:
        while swaps[0] < SWAPS_AT_LEAST and time.monotonic() < deadline:
            try:
                data = reader.read(str(home / "race" / "sub" / "passwd") if through == "directory"
                                   else str(home / "race" / "sub"))
            except FileError as exc:
                outcomes[exc.code] = outcomes.get(exc.code, 0) + 1
                continue
            assert b"SECRET" not in data, f"read left the roots after {sum(outcomes.values())} reads"
            outcomes["read"] = outcomes.get("read", 0) + 1
    finally:
        stop.set()
        thread.join(timeout=5)
    assert swaps[0] >= 100, f"the swapper barely ran ({swaps[0]} swaps): the race was not exercised"
    # the race was real: reads landed on both sides of the swap
    assert outcomes.get("read", 0) > 0 and sum(v for k, v in outcomes.items() if k != "read") > 0, outcomes


def test_reads_through_links_that_stay_inside_still_work(tmp_path):
    home = tmp_path / "home"
    (home / "a" / "b").mkdir(parents=True)
    (home / "a" / "b" / "f.txt").write_text("ok")
    (home / "link-dir").symlink_to(home / "a")
    (home / "link-file").symlink_to(home / "a" / "b" / "f.txt")
    reader = FileReader([str(home)])
    assert reader.read(str(home / "link-dir" / "b" / "f.txt")) == b"ok"
    assert reader.read(str(home / "link-file")) == b"ok"
    with pytest.raises(FileError) as info:
        reader.read(str(home / "a"))
    assert info.value.code == "bad_path"
