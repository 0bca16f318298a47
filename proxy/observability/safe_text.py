"""Client-controlled text made safe to show in a log line, a terminal table or a CSV cell.

A model name, an error message quoting one, a header: whatever a client chose may hold
characters that steer what reads it. C0 and C1 controls move a terminal's cursor or end a log
line early (`\\x9b2J` clears a screen); bidi overrides and isolates (U+202A-202E, U+2066-2069,
U+200E/200F, U+061C) show text in another order than it is stored; zero-width characters
(U+200B-200D, U+2060, U+FEFF) and blank letters hide text or make two names look alike; U+2028
and U+2029 break a line where a reader does not expect one. Each of them, and every other
character Python does not count as printable (format, separator, private-use, unassigned and
surrogate code points; every space but the ASCII one), is written as a visible escape: `\\t`,
`\\x9b`, `\\u200b`, `\\U000e0041`. A backslash is written twice, so an escape the client typed
itself is told apart from one made here.

A spreadsheet runs a cell that starts with `=`, `+`, `-` or `@` as a formula: such a cell gets a
leading `'`, and the first character looked at is the first one a reader would see, past the
invisible ones (`\\u200b=1+1` is a formula to a spreadsheet that drops the zero-width space).
"""

from __future__ import annotations

import re
from typing import Any

# Letters that are printable to Python but show as nothing: the Hangul fillers and the combining
# grapheme joiner, used to make a name look empty or like another.
_BLANK_LETTERS = "\u034f\u115f\u1160\u3164\uffa0"
_NEEDS_A_LOOK = re.compile(f"[\\\\{_BLANK_LETTERS}]")
_NAMED = {"\t": "\\t", "\n": "\\n", "\r": "\\r", "\\": "\\\\"}
# What a spreadsheet takes for the start of a formula (the fullwidth forms too: some read them so).
_FORMULA_STARTS = frozenset("=+-@\uff1d\uff0b\uff0d\uff20")


def shown(text: str) -> str:
    """`text` with every character that steers or hides written as a visible escape."""
    # Most text is plain ASCII, returned as it is after scans in C.
    if text.isascii():
        if text.isprintable() and "\\" not in text:
            return text
    elif text.isprintable() and _NEEDS_A_LOOK.search(text) is None:
        return text
    return "".join(map(_escaped, text))


def _escaped(char: str) -> str:
    if (named := _NAMED.get(char)) is not None:
        return named
    if char.isprintable() and char not in _BLANK_LETTERS:
        return char
    code = ord(char)
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}"


def _invisible(char: str) -> bool:
    return not char.isprintable() or char.isspace() or char in _BLANK_LETTERS


def csv_cell(value: Any) -> Any:
    """A CSV cell: text shown as `shown` makes it, and quoted with `'` when a spreadsheet would
    run it as a formula; anything else (numbers, None) as it is."""
    if not isinstance(value, str):
        return value
    first = next((char for char in value if not _invisible(char)), "")
    return "'" + shown(value) if first in _FORMULA_STARTS else shown(value)


def shown_fields(event: dict[str, Any]) -> dict[str, Any]:
    """Every text value of a log event, shown (in place; the event is returned)."""
    for name, value in event.items():
        if type(value) is str:
            event[name] = shown(value)
    return event
