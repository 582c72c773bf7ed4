"""What the controller and the guest agent exchange, defined once and importable by both.

:mod:`wire.actions` is the computer action schema (pydantic models only); :mod:`wire.connections` the
connection rules every HTTP server of the project keeps (uvicorn and h11, which every side has). This
package imports nothing from ``guest`` or ``controller`` and needs none of their own dependencies (no
Xlib, FastAPI, mitmproxy or openai), so the guest image and the controller both carry it as is.
"""
