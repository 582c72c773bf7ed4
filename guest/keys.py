"""Key names (as models write them) -> X keysyms.

Resolution order for one name, first match wins:

1. the alias table below, case-insensitive (``ENTER``, ``ctrl``, ``PgDn``, ``ArrowLeft``, ``F13``,
   ``CMD`` ...); modifier aliases mean the left-hand key (``CTRL`` -> ``Control_L``), while the
   explicit right-hand names (``Control_R``, ``Shift_R``, ``Alt_R``, ``Super_R``) stay right-hand;
2. a single character: its own keysym (``"a"``, ``"A"``, ``"<"``, ``"é"``, ``"日"``);
3. any X keysym name, exact spelling first (``Control_R``, ``XF86AudioMute``, ``KP_Enter``), then
   case-insensitively (``control_r``);

otherwise :class:`UnknownKey` (HTTP 400 ``unknown_key``). Resolution is pure: nothing is sent to the
X server, so an unknown name in a request stops it before any key event.

Some keysyms are not input for applications but commands to the X server: bound to a key, XKB's
compatibility map turns them into server actions. ``Terminate_Server`` ends the server (one XTEST
press of it makes Xvfb exit); the others toggle AccessX controls (``SlowKeys_Enable`` ...), emulate
the pointer (``Pointer_*``, MouseKeys), switch virtual screens or VTs, break grabs or write server
logs (``XF86Switch_VT_*``, ``XF86Ungrab``, ``XF86ClearGrab``, ``XF86LogWindowTree`` ...), each
depending on the server and its options. No application reads them as input, so
:func:`is_server_control` names the whole class and the agent refuses it (HTTP 400
``invalid_action``) whatever X server runs. The ranges come from the keysym blocks of
``X11/keysymdef.h`` (XKB) and ``X11/XF86keysym.h``.
"""

from __future__ import annotations

from functools import lru_cache

from Xlib import XK

# Make the full keysym name tables available (latin1 + miscellany are loaded by default).
for _group in ("xkb", "xf86", "latin2", "latin3", "latin4", "greek", "cyrillic", "katakana",
               "arabic", "hebrew", "thai", "korean", "currency", "special", "publishing",
               "technical", "apl"):
    try:
        XK.load_keysym_group(_group)
    except (ImportError, AttributeError):  # pragma: no cover - optional groups
        pass


class UnknownKey(ValueError):
    """A key name that maps to no keysym. ``name`` is the name as given."""

    def __init__(self, name: str) -> None:
        super().__init__(f"unknown key name: {name!r}")
        self.name = name


#: Aliases, keyed upper-case, value = X keysym name.
ALIASES: dict[str, str] = {
    "ENTER": "Return", "RETURN": "Return",
    "ESC": "Escape", "ESCAPE": "Escape",
    "TAB": "Tab", "SPACE": "space", "SPACEBAR": "space",
    "BACKSPACE": "BackSpace", "BACK_SPACE": "BackSpace",
    "DELETE": "Delete", "DEL": "Delete",
    "INSERT": "Insert", "INS": "Insert",
    "HOME": "Home", "END": "End",
    "PAGEUP": "Prior", "PGUP": "Prior", "PAGE_UP": "Prior", "PRIOR": "Prior",
    "PAGEDOWN": "Next", "PGDN": "Next", "PAGE_DOWN": "Next", "NEXT": "Next",
    "LEFT": "Left", "ARROWLEFT": "Left", "ARROW_LEFT": "Left",
    "RIGHT": "Right", "ARROWRIGHT": "Right", "ARROW_RIGHT": "Right",
    "UP": "Up", "ARROWUP": "Up", "ARROW_UP": "Up",
    "DOWN": "Down", "ARROWDOWN": "Down", "ARROW_DOWN": "Down",
    "CTRL": "Control_L", "CONTROL": "Control_L", "LCTRL": "Control_L", "CONTROL_L": "Control_L",
    "RCTRL": "Control_R",
    "ALT": "Alt_L", "OPTION": "Alt_L", "LALT": "Alt_L", "RALT": "Alt_R",
    "SHIFT": "Shift_L", "LSHIFT": "Shift_L", "RSHIFT": "Shift_R",
    "CMD": "Super_L", "COMMAND": "Super_L", "SUPER": "Super_L", "META": "Super_L",
    "WIN": "Super_L", "WINDOWS": "Super_L", "OS": "Super_L",
    "CAPSLOCK": "Caps_Lock", "CAPS_LOCK": "Caps_Lock",
    "NUMLOCK": "Num_Lock", "SCROLLLOCK": "Scroll_Lock",
    "PRINTSCREEN": "Print", "PRINT": "Print", "PAUSE": "Pause", "MENU": "Menu",
    "+": "plus", "PLUS": "plus", "MINUS": "minus",
}
for _n in range(1, 25):
    ALIASES[f"F{_n}"] = f"F{_n}"


@lru_cache(maxsize=1)
def _lower_keysym_names() -> dict[str, int]:
    """All keysym names known to python-xlib, lower-cased -> keysym (first spelling wins)."""
    table: dict[str, int] = {}
    for attr in dir(XK):
        if attr.startswith("XK_"):
            name = attr[3:].replace("XF86_", "XF86", 1)
            table.setdefault(name.lower(), getattr(XK, attr))
    return table


def char_to_keysym(char: str) -> int:
    """The keysym that produces one character: Latin-1 code points map to themselves,
    everything else to the Unicode keysym ``0x01000000 + code point`` (X11 keysym spec, App. A).
    """
    code = ord(char)
    if 0x20 <= code <= 0x7E or 0xA0 <= code <= 0xFF:
        return code
    return 0x01000000 + code


def _is_fkey(name: str) -> bool:
    return name[:1] == "F" and name[1:].isdigit()


@lru_cache(maxsize=1)
def _keysym_names() -> dict[int, str]:
    """keysym -> one X keysym name (the shortest spelling python-xlib knows)."""
    table: dict[int, str] = {}
    for attr in dir(XK):
        if attr.startswith("XK_"):
            value = getattr(XK, attr)
            name = attr[3:].replace("XF86_", "XF86", 1)
            old = table.get(value)
            # Function keys keep their F-name (F24, not R4); otherwise the shortest spelling.
            if old is None or (not _is_fkey(old) and (_is_fkey(name) or len(name) < len(old))):
                table[value] = name
    return table


def keysym_name(keysym: int) -> str:
    """Name of a keysym for logs and errors: the X name (``'Return'``, ``'eacute'``), or
    ``'U+65E5'`` for Unicode keysyms, else hex."""
    name = _keysym_names().get(keysym)
    if name:
        return name
    if keysym & 0xFF000000 == 0x01000000:
        return f"U+{keysym & 0xFFFFFF:04X}"
    return hex(keysym)


def resolve(name: str) -> int:
    """Resolve one key name to a keysym (see module doc for the rules).

    Raises:
        UnknownKey: the name maps to nothing (also for an empty name).
    """
    if not isinstance(name, str) or name == "":
        raise UnknownKey(str(name))
    alias = ALIASES.get(name.upper())
    if alias is not None:
        return XK.string_to_keysym(alias)
    if len(name) == 1:
        if name == "\n" or name == "\r":
            return XK.string_to_keysym("Return")
        if name == "\t":
            return XK.string_to_keysym("Tab")
        if ord(name) < 0x20 or ord(name) == 0x7F:
            raise UnknownKey(name)
        return char_to_keysym(name)
    keysym = XK.string_to_keysym(name)
    if keysym:
        return keysym
    if name.startswith("XF86") and not name.startswith("XF86_"):
        keysym = XK.string_to_keysym("XF86_" + name[4:])
        if keysym:
            return keysym
    keysym = _lower_keysym_names().get(name.lower(), 0)
    if keysym:
        return keysym
    raise UnknownKey(name)


#: Keysym ranges that command the X server (see module doc), inclusive.
SERVER_CONTROL_RANGES: tuple[tuple[int, int], ...] = (
    (0xFE70, 0xFE7F),          # AccessX_Enable ... AudibleBell_Enable (XKB accessibility controls)
    (0xFED0, 0xFEDF),          # First/Prev/Next/Last_Virtual_Screen, Terminate_Server
    (0xFEE0, 0xFEFF),          # Pointer_* (MouseKeys: pointer motion, button clicks, drag locks)
    (0x1008FE00, 0x1008FEFF),  # XF86Switch_VT_*, XF86Ungrab, XF86ClearGrab, XF86*_VMode, XF86Log*
)


def is_server_control(keysym: int) -> bool:
    """True for a keysym that acts on the X server instead of reaching applications."""
    return any(lo <= keysym <= hi for lo, hi in SERVER_CONTROL_RANGES)


#: Keypad keysyms (``X11/keysymdef.h``'s ``KP_Space`` .. ``KP_Equal``), inclusive: the second keysym of a
#: keypad key is reached with Num Lock, not Shift (X11 protocol, "Keyboards"; XKB's ``KEYPAD`` types).
KEYPAD_RANGE = (0xFF80, 0xFFBD)


def is_keypad(keysym: int) -> bool:
    """True for a keypad keysym (``KP_1``, ``KP_End``, ``KP_Enter`` ...)."""
    return KEYPAD_RANGE[0] <= keysym <= KEYPAD_RANGE[1]


#: Keysyms that are modifiers (their presence in a chord makes a letter mean its key cap).
MODIFIER_KEYSYMS: frozenset[int] = frozenset(
    XK.string_to_keysym(n)
    for n in ("Shift_L", "Shift_R", "Control_L", "Control_R", "Alt_L", "Alt_R", "Meta_L", "Meta_R",
              "Super_L", "Super_R", "Hyper_L", "Hyper_R", "ISO_Level3_Shift", "Mode_switch")
)
