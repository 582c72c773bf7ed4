"""Print the ENV settings of a Dockerfile as a systemd EnvironmentFile (KEY=VALUE lines).

The VM guest's session runs with exactly the environment the container image declares, so the two
guests cannot drift apart. Handles the forms Dockerfile.desktop uses: ``ENV K=V K2="V2" \\`` continued
over several lines; the legacy ``ENV K V`` form too. Usage: dockerfile-env.py Dockerfile
"""

from __future__ import annotations

import shlex
import sys


def env_settings(text: str) -> list[tuple[str, str]]:
    """``[(key, value), ...]`` from every ENV instruction of the Dockerfile ``text``, in order."""
    logical, current = [], ""
    for line in text.splitlines():
        stripped = line.strip()
        if not current and (not stripped or stripped.startswith("#")):
            continue
        if stripped.endswith("\\"):
            current += stripped[:-1] + " "
            continue
        logical.append(current + stripped)
        current = ""
    settings = []
    for line in logical:
        word, _, rest = line.partition(" ")
        if word.upper() != "ENV":
            continue
        tokens = shlex.split(rest)
        if tokens and "=" not in tokens[0]:
            settings.append((tokens[0], " ".join(tokens[1:])))
            continue
        for token in tokens:
            key, _, value = token.partition("=")
            settings.append((key, value))
    return settings


if __name__ == "__main__":
    for key, value in env_settings(open(sys.argv[1], encoding="utf-8").read()):
        print(f"{key}={value}")
