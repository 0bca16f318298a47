"""The WHATWG algorithm for interpreting an event stream (HTML Living Standard, 9.2.6), written
straight from its text, over a whole stream, line by line: what the gateway's parser is held to.
Deliberately plain and slow, and sharing nothing with the parser.

The spec decodes the stream as UTF-8 (dropping one leading byte order mark) and then reads it
line by line. The lines are cut here in the bytes and decoded one by one, which gives the same
lines: a line end is an ASCII byte, and a UTF-8 decoder never takes an ASCII byte into another
character (an invalid sequence before one becomes U+FFFD and the byte stays itself). Cutting in
the bytes says where each blank line ends, in the stream's own bytes."""

from __future__ import annotations

from dataclasses import dataclass, field

CR, LF = 0x0D, 0x0A
BOM = b"\xef\xbb\xbf"


@dataclass
class Interpretation:
    blank_lines: list[int] = field(default_factory=list)  # the offset just past each blank line
    events: list[tuple[str, str]] = field(default_factory=list)  # (type, data) of each event dispatched

    def cut(self, stream: bytes) -> tuple[list[bytes], bytes]:
        """The stream's bytes cut at its blank lines, and what is left after the last one."""
        pieces, start = [], 0
        for end in self.blank_lines:
            pieces.append(stream[start:end])
            start = end
        return pieces, stream[start:]


def interpret(stream: bytes) -> Interpretation:
    out = Interpretation()
    data, event_type = "", ""  # the data buffer and the event type buffer
    pos = len(BOM) if stream.startswith(BOM) else 0
    while True:
        # "a CRLF pair, a single LF not preceded by a CR, and a single CR not followed by a LF
        # being the ways in which a line can end"
        end = pos
        while end < len(stream) and stream[end] not in (CR, LF):
            end += 1
        if end == len(stream):
            break  # "Once the end of the file is reached, any pending data must be discarded."
        line = stream[pos:end].decode("utf-8", "replace")
        pos = end + 2 if stream[end] == CR and stream[end + 1 : end + 2] == b"\n" else end + 1
        if line == "":  # "If the line is empty (a blank line): Dispatch the event"
            out.blank_lines.append(pos)
            if data == "":  # "If the data buffer is an empty string, set the data buffer and the
                event_type = ""  # event type buffer to the empty string and return."
                continue
            if data.endswith("\n"):  # "If the data buffer's last character is a LF, remove it"
                data = data[:-1]
            out.events.append((event_type or "message", data))
            data, event_type = "", ""
        elif line.startswith(":"):  # "If the line starts with a colon: Ignore the line."
            continue
        else:
            # "If the line contains a colon: the characters before the first colon are the field,
            # those after it the value; if value starts with a space, remove it. Otherwise, the
            # string is not empty but does not contain a colon: the whole line is the field, and
            # the empty string the value."
            name, _, value = line.partition(":")
            if value.startswith(" "):
                value = value[1:]
            if name == "event":
                event_type = value
            elif name == "data":
                data += value + "\n"
            # (id and retry: nothing the gateway reads; any other field is ignored)
    return out


def dispatched(events: list) -> list[tuple[str, str]]:  # type: ignore[type-arg]
    """What a browser dispatches of the parser's events (`SSEEvent`s): those with data."""
    return [(e.name or "message", e.data) for e in events if e.data is not None]
