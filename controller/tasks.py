"""Task files (``tasks/*.toml``): what the model is asked to do, how it sees the screen, what runs
in the guest first, the network policy, and how the outcome is verified.

Schema (contract): ``name``, ``instructions``, ``[screen]`` (width, height; default 1280x800),
``[model]`` (max_width, max_height, optional crop = [x, y, w, h] in screen px), ``[[launch]]``
(app, args), ``[network]`` (mode "deny-all" | "allowlist", allow = origins), ``[[checks]]``
(kind "file" | "sqlite"), ``[offline]`` (script, relative to the task file).

Extensions kept optional: ``max_steps``; ``[model]`` format/quality/max_bytes; ``[[ready]]``
conditions the runner waits for after launching (a file appearing in the guest); sqlite checks'
``bind_files`` (guest files whose text, trailing whitespace removed, is bound to the query's ``?``).
"""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Annotated, Any, Literal, Union

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", protected_namespaces=())


class Screen(_Strict):
    """Guest screen size in screen px."""

    width: int = Field(1280, ge=64, le=8192)
    height: int = Field(800, ge=64, le=8192)


class ModelView(_Strict):
    """What the model sees: bounding box (model px), optional crop (screen px), encoding and size cap."""

    max_width: int | None = Field(1280, ge=16)
    max_height: int | None = Field(800, ge=16)
    crop: tuple[int, int, int, int] | None = None
    format: Literal["png", "jpeg"] = "png"
    quality: int = Field(85, ge=1, le=100)
    max_bytes: int = Field(4 * 1024 * 1024, ge=1024)

    @field_validator("crop")
    @classmethod
    def _crop_sane(cls, v: tuple[int, int, int, int] | None) -> tuple[int, int, int, int] | None:
        if v is not None and (v[0] < 0 or v[1] < 0 or v[2] <= 0 or v[3] <= 0):
            raise ValueError("crop must be [x, y, w, h] with x, y >= 0 and w, h > 0")
        return v


class Launch(_Strict):
    """An allowlisted app the agent starts before the loop."""

    app: str
    args: list[str] = []


class Ready(_Strict):
    """A condition the runner waits for after launching: ``file`` exists in the guest."""

    file: str
    timeout_s: float = Field(60.0, gt=0)


class Network(_Strict):
    """Egress policy for the guest: deny everything, or allow the listed origins."""

    mode: Literal["deny-all", "allowlist"] = "deny-all"
    allow: list[str] = []

    @model_validator(mode="after")
    def _consistent(self) -> "Network":
        if self.mode == "deny-all" and self.allow:
            raise ValueError("network.allow must be empty when mode is deny-all")
        return self


class FileCheck(_Strict):
    """Compare a guest file with ``value`` by ``match``.

    exact: bytes equal the UTF-8 of value; text: equal after removing trailing whitespace on both;
    regex: Python ``re.search(value, text)``; json: parsed JSON equals value (a TOML table/array or
    a JSON string).
    """

    kind: Literal["file"]
    path: str
    match: Literal["exact", "text", "regex", "json"]
    value: Any


class SqliteCheck(_Strict):
    """Run ``query`` on a copy of the guest's SQLite database (with its -wal/-shm), opened read-only.

    ``rows``: the expected result, a list of rows (each a list of values), compared exactly and in
    order. ``bind_files``: guest files whose text (trailing whitespace removed) is bound, in order,
    to the query's ``?`` parameters -- this is how a check ties a file to a database record.
    """

    kind: Literal["sqlite"]
    path: str
    query: str
    rows: list[list[Any]]
    bind_files: list[str] = []


Check = Annotated[Union[FileCheck, SqliteCheck], Field(discriminator="kind")]


class Offline(_Strict):
    """The scripted model turns (contract 3), path relative to the task file."""

    script: str
    legacy: bool = False


class Task(_Strict):
    """A task file. ``source`` is the file it came from (set by :func:`load_task`)."""

    name: str
    instructions: str
    screen: Screen = Screen()
    model: ModelView = ModelView()
    launch: list[Launch] = []
    ready: list[Ready] = []
    network: Network = Network()
    checks: list[Check] = []
    offline: Offline | None = None
    max_steps: int = Field(20, ge=1, le=500)
    source: Path | None = None

    def offline_script_path(self) -> Path:
        """Absolute path of the offline script; raises ValueError when the task has none."""
        if self.offline is None:
            raise ValueError(f"task {self.name!r} has no [offline] script")
        base = self.source.parent if self.source else Path.cwd()
        return (base / self.offline.script).resolve()


def load_task(path: str | Path) -> Task:
    """Read and validate a task TOML file. Raises FileNotFoundError, tomllib.TOMLDecodeError or
    pydantic.ValidationError."""
    path = Path(path)
    data = tomllib.loads(path.read_text(encoding="utf-8"))
    data.pop("source", None)
    task = Task.model_validate(data)
    return task.model_copy(update={"source": path.resolve()})
