"""JSON values compared as JSON, not as Python objects (``file`` checks with ``match = "json"``).

Python's ``json`` module maps JSON onto Python types whose equality is looser than JSON's: ``true ==
1`` and ``false == 0`` hold in Python, a duplicate object key silently keeps its last value, and
``NaN``/``Infinity`` (not JSON) parse. Here:

* :func:`loads` parses strict JSON (RFC 8259): a duplicate key anywhere in an object, a ``NaN``,
  ``Infinity`` or ``-Infinity`` token, or a number no double holds (``1e309``) makes the text invalid (:class:`ValueError`, the
  ``json.JSONDecodeError`` subclass for syntax errors).
* :func:`equal` compares two parsed values by JSON's data model: ``true``, ``false`` and ``null`` are
  their own kinds, never numbers; numbers compare by value (``2`` and ``2.0`` are the same JSON number);
  strings by code points; arrays element by element in order; objects by their key sets and the value
  under each key, in any order.

The rule is stated in ARCHITECTURE.md (contract 2, file checks).
"""

from __future__ import annotations

import json
import math
from typing import Any


class DuplicateKey(ValueError):
    """An object in the text holds the same key twice."""


def _pairs(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    seen: dict[str, Any] = {}
    for key, value in pairs:
        if key in seen:
            raise DuplicateKey(f"duplicate key {key!r} in an object")
        seen[key] = value
    return seen


def _no_constant(token: str) -> Any:
    raise ValueError(f"{token} is not JSON")


def _finite(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"number {text[:40]} is out of range")
    return value


def loads(text: str) -> Any:
    """The value of ``text`` as strict JSON. Raises ValueError (duplicate key, NaN/Infinity, a number
    too large for a double such as ``1e309``, an integer past Python's digit limit) or
    ``json.JSONDecodeError`` (a ValueError: bad syntax); RecursionError when nested too deeply."""
    return json.loads(text, object_pairs_hook=_pairs, parse_constant=_no_constant, parse_float=_finite)


def _kind(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, (int, float)):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, (list, tuple)):
        return "array"
    if isinstance(value, dict):
        return "object"
    return type(value).__name__


def equal(a: Any, b: Any) -> bool:
    """True when ``a`` and ``b`` (parsed JSON, or TOML values of the same shapes) are the same JSON
    value by the rule above. Values of any other Python type are never equal to anything."""
    kind = _kind(a)
    if kind != _kind(b):
        return False
    if kind == "null":
        return True
    if kind in ("boolean", "string"):
        return a == b
    if kind == "number":
        if isinstance(a, float) and not math.isfinite(a) or isinstance(b, float) and not math.isfinite(b):
            return False
        return a == b
    if kind == "array":
        return len(a) == len(b) and all(equal(x, y) for x, y in zip(a, b))
    if kind == "object":
        return a.keys() == b.keys() and all(equal(a[k], b[k]) for k in a)
    return False
