"""The sign-in wire schema: what the agent reports of a sign-in form and what it is asked to fill.

One home for these shapes (docs/ARCHITECTURE.md, contract 8): the guest agent serves them on
``GET/POST /v1/browser/signin``, the controller reads them, and the ``browser_authentication`` request a
person answers is built from :class:`SignInForm` (the hosted sessions' shape, ``004``: fields ``{id,
label, type, required}``, options ``{id, label, field_ids}``).

Limits (after the hosted sessions' credential submission limits, ``004``): at most
:data:`MAX_FIELDS` values in one submission, each field at most once, each value at most
:data:`MAX_VALUE_CHARS` characters, the serialized values and option at most :data:`MAX_SUBMIT_BYTES`.
A form reports at most :data:`MAX_FIELDS` fields and :data:`MAX_OPTIONS` options, labels cut to
:data:`MAX_LABEL_CHARS` characters; ids are tokens of :data:`ID_PATTERN`. A value holds none of
:data:`VALUE_FORBIDDEN`. Values go only into a POST form whose destination is the credential origin
(:func:`form_refusal`).

Values are credentials: :class:`FillField` keeps its ``value`` out of ``repr`` and out of validation
errors' input echo, and nothing here logs.
"""

from __future__ import annotations

import json
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictStr, field_validator, model_validator

MAX_FIELDS = 6
"""Most fields in one form report and most values in one submission."""
MAX_OPTIONS = 6
"""Most sign-in methods in one form report."""
MAX_LABEL_CHARS = 200
"""Labels are cut to this many characters by the agent."""
MAX_VALUE_CHARS = 16384
"""Longest value of one field (characters)."""
MAX_SUBMIT_BYTES = 120 * 1024
"""Largest serialized ``{fields, selected_option}`` of one submission (bytes of JSON)."""
ID_PATTERN = r"^[A-Za-z0-9_.:~-]{1,80}$"
"""A field's or option's id as the agent makes it (the element's id or name when it is such a token)."""

FieldType = Literal["password", "email", "text"]
FieldKind = Literal["password", "email", "code"]
Outcome = Literal["submitted", "origin_changed", "form_changed", "field_unstable", "no_form", "unsafe_form",
                  "cross_origin_form", "invalid", "cross_origin_redirect"]
"""What a fill came to: ``submitted`` (values typed, form submitted); ``origin_changed`` (the page's
origin was not ``credential_origin`` when a value was to be typed: nothing more typed, what was typed
cleared); ``form_changed`` (a field or option of the request is no longer on the page); ``field_unstable``
(the page replaced or rewrote a field while it was typed into, three times: cleared, not submitted);
``no_form`` (no sign-in form on the page any more); ``unsafe_form`` (the form would send the values
other than in a POST body -- its method or the submit button's ``formmethod`` is ``get``, ``dialog`` or
another -- or the fields are in no form: nothing typed, or, found at the submit, what was typed cleared
and nothing submitted); ``cross_origin_form`` (the form's ``action`` or the submit button's
``formaction`` resolves to an origin other than ``credential_origin``: the same); ``invalid`` (the
browser's own validation would stop the submit -- ``required``, ``pattern``, ``type=email`` and the like:
what was typed cleared, nothing submitted, ``detail`` names the field and the constraint);
``cross_origin_redirect`` (the form was submitted to ``credential_origin``, whose answer redirected the
POST -- a 307 or 308, which sends the body again -- to another origin: that hop was refused before the
body left, ``destination`` is that origin; the tab shows the agent's refusal page)."""

SUBMIT_METHOD = "post"
"""The only form method a fill submits: the values travel in the request body, never in a URL."""
MAX_DETAIL_CHARS = 300
"""Longest :attr:`FillResult.detail` (characters)."""
VALUE_FORBIDDEN = ("\x00", "\r", "\n")
"""Characters a value may not hold: NUL (refused by every text of the API) and the line breaks an
``<input>`` drops from its value (the field would hold, and send, another value)."""


def form_refusal(credential_origin: str, method: str, destination: str) -> tuple[Outcome, str] | None:
    """Whether a form with values must not be filled: ``(outcome, detail)`` -- ``unsafe_form`` when
    ``method`` (the form's, or the submit button's ``formmethod``, lower case; empty: no form) is not
    :data:`SUBMIT_METHOD`, ``cross_origin_form`` when ``destination`` (the origin its ``action`` or the
    button's ``formaction`` resolves to; ``null`` for an opaque one such as ``javascript:``) is not
    ``credential_origin`` -- or None. The agent applies the same rule again in the page right before
    it submits (``guest.browser``, ``SUBMIT_JS``), in the same script run as the click."""
    if not method:
        return "unsafe_form", "the fields belong to no form: where their values would go is up to the page's script"
    if method != SUBMIT_METHOD:
        return "unsafe_form", (f"the form's method is {method[:20]!r}, not post: the values would be "
                               + ("in the URL" if method == "get" else "sent other than in a request body"))
    if destination != credential_origin:
        return "cross_origin_form", (f"the form sends to {destination[:120]}, not to the page's origin "
                                     f"{credential_origin[:120]}")[:MAX_DETAIL_CHARS]
    return None


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, hide_input_in_errors=True)


class SignInField(_Strict):
    """A control of a sign-in form: ``type`` is how to render it (password, email, text), ``kind`` what
    it asks for (password, email, code: the words the agent matched in its type, name, autocomplete
    hint or label)."""

    id: StrictStr = Field(pattern=ID_PATTERN)
    label: StrictStr = Field(max_length=MAX_LABEL_CHARS)
    type: FieldType
    kind: FieldKind
    required: StrictBool


class SignInOption(_Strict):
    """A sign-in method (a radio button or a submit button of the form) and the fields it takes."""

    id: StrictStr = Field(pattern=ID_PATTERN)
    label: StrictStr = Field(max_length=MAX_LABEL_CHARS)
    field_ids: list[StrictStr] = Field(default_factory=list, max_length=MAX_FIELDS)


class SignInForm(_Strict):
    """The sign-in form of the page the agent's chromium shows: ``fields`` (a form with credential
    inputs) or ``options`` (a method choice), never both empty; ``method`` (lower case: ``post``,
    ``get``, ``dialog``...; empty when the fields are in no form) and ``destination`` (the origin the
    values would be sent to: the form's ``action``, or its submit button's ``formaction``, resolved
    against the document's base URL; ``null`` for an opaque one such as ``javascript:``; empty with no
    form), as the form stands when it is read (:func:`form_refusal` decides on them; None: not read)."""

    fields: list[SignInField] = Field(default_factory=list, max_length=MAX_FIELDS)
    options: list[SignInOption] = Field(default_factory=list, max_length=MAX_OPTIONS)
    method: StrictStr | None = Field(default=None, max_length=20)
    destination: StrictStr | None = Field(default=None, max_length=2048)

    def refusal(self, credential_origin: str) -> tuple[Outcome, str] | None:
        """:func:`form_refusal` for a form with fields (a method choice alone carries no value) whose
        method and destination were read: None when it may be filled."""
        if not self.fields or self.method is None or self.destination is None:
            return None
        return form_refusal(credential_origin, self.method, self.destination)


class SignInPage(_Strict):
    """``GET /v1/browser/signin``: the active tab's ``origin`` as the browser knows it (the main frame's
    security origin, never page text), its ``url`` and ``title`` (page text: escape before showing),
    and its sign-in ``form`` or None."""

    origin: StrictStr
    url: StrictStr
    title: StrictStr
    form: SignInForm | None = None


class FillField(_Strict):
    """One value to type into field ``field_id``."""

    field_id: StrictStr = Field(pattern=ID_PATTERN)
    value: StrictStr = Field(min_length=1, max_length=MAX_VALUE_CHARS, repr=False)

    @field_validator("value")
    @classmethod
    def _one_line(cls, value: str) -> str:
        if any(c in value for c in VALUE_FORBIDDEN):
            raise ValueError("a value must not contain NUL, CR or LF")
        return value


class FillRequest(_Strict):
    """``POST /v1/browser/signin``: type ``fields`` into the active tab's form, after choosing
    ``selected_option`` when given, and submit it, only while the page's origin is ``credential_origin``."""

    credential_origin: StrictStr = Field(min_length=1, max_length=2048)
    fields: list[FillField] = Field(default_factory=list, max_length=MAX_FIELDS)
    selected_option: StrictStr | None = Field(default=None, pattern=ID_PATTERN)

    @model_validator(mode="after")
    def _limits(self) -> "FillRequest":
        ids = [f.field_id for f in self.fields]
        if len(set(ids)) != len(ids):
            raise ValueError("each field may be given once")
        size = len(json.dumps({"fields": [{"field_id": f.field_id, "value": f.value} for f in self.fields],
                               "selected_option": self.selected_option}).encode())
        if size > MAX_SUBMIT_BYTES:
            raise ValueError(f"the fields and option take more than {MAX_SUBMIT_BYTES} bytes of JSON")
        if not self.fields and self.selected_option is None:
            raise ValueError("give fields, a selected_option, or both")
        return self


class FillResult(_Strict):
    """What ``POST /v1/browser/signin`` did: ``outcome``; ``navigated``: the page loaded a new document
    after the submit; ``origin``: the active tab's origin afterwards; ``destination``: the origin the
    form sends to, when the fill got as far as reading it (for ``cross_origin_redirect``: the origin the
    refused redirect led to); ``detail``: why, for ``unsafe_form``, ``cross_origin_form``, ``invalid`` and
    ``cross_origin_redirect`` (page text: escape before showing; never a value)."""

    outcome: Outcome
    navigated: StrictBool = False
    origin: StrictStr = ""
    destination: StrictStr = Field(default="", max_length=2048)
    detail: StrictStr = Field(default="", max_length=MAX_DETAIL_CHARS)
