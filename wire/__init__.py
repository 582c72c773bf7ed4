"""What the controller and the guest agent exchange, defined once and importable by both.

:mod:`wire.actions` is the computer action schema (pydantic models only). This package imports
nothing from ``guest`` or ``controller`` and needs none of their dependencies (no Xlib, FastAPI,
mitmproxy or openai), so the guest image and the controller both carry it as is.
"""
