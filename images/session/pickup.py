"""Start the demo app (``images/pickup/``) on 127.0.0.1:8080 when the image carries one.

Hook, in order of preference:

1. ``images/pickup/start.json``: a JSON argv list, exec'd as is from ``images/pickup/`` (``{src}`` in an
   argument is replaced by the project root in the image);
2. ``images/pickup/app.py`` with an ASGI ``app``: ``python -m uvicorn app:app --host 127.0.0.1 --port 8080``;
3. nothing: exit 0 (supervisord treats that as expected and does not restart it).

Environment: ``PICKUP_PORT`` (default 8080). The app binds loopback only: the browser in the guest reaches
it, nothing outside the guest does.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

SRC = Path(__file__).resolve().parents[2]
APP_DIR = SRC / "images" / "pickup"


def command() -> list[str] | None:
    """The argv that starts the demo app, or None when the image has none."""
    start = APP_DIR / "start.json"
    if start.is_file():
        argv = json.loads(start.read_text())
        if not (isinstance(argv, list) and argv and all(isinstance(a, str) for a in argv)):
            raise SystemExit(f"pickup: {start} must hold a JSON list of strings")
        return [a.replace("{src}", str(SRC)) for a in argv]
    if (APP_DIR / "app.py").is_file():
        port = os.environ.get("PICKUP_PORT", "8080")
        return [sys.executable, "-m", "uvicorn", "app:app", "--host", "127.0.0.1", "--port", port,
                "--app-dir", str(APP_DIR)]
    return None


def main() -> None:
    argv = command()
    if argv is None:
        print("pickup: no demo app in this image (images/pickup/ absent)", flush=True)
        sys.exit(0)
    os.chdir(APP_DIR)
    print("pickup: exec " + " ".join(argv), flush=True)
    os.execvp(argv[0], argv)


if __name__ == "__main__":
    main()
