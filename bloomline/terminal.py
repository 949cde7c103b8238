"""Untrusted text (documents, ids, file names, lines of a file, messages quoting them) made safe to
show on a terminal.

A terminal obeys the control characters it is sent: ESC and the C1 controls (CSI ``\\x9b``, OSC
``\\x9d``) start sequences that recolour, move the cursor, rewrite the window title or, on some
terminals, write the clipboard; a carriage return overwrites the line before it. So every C0
control character but tab and newline, DEL and every C1 control character is shown as its
``\\xNN`` escape (:func:`printable`). Text that ``rich`` prints as markup (``console.print`` of an
f-string) has its square brackets escaped too (:func:`rich_escape`), so a ``[bold red]`` or a
``[link=...]`` in a file shows as written.
"""

from __future__ import annotations

import re

_CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f]")
"""C0 controls but tab (\\x09) and newline (\\x0a), DEL and C1 controls."""
_CONTROL_OR_LINE = re.compile("[\x00-\x1f\x7f-\x9f]")


def printable(text: object, lines: bool = True) -> str:
    """``str(text)`` with each control character written as ``\\xNN`` (tab and newline kept when
    ``lines``, escaped too when not)."""
    return (_CONTROL if lines else _CONTROL_OR_LINE).sub(lambda m: f"\\x{ord(m.group()):02x}", str(text))


def rich_escape(text: object) -> str:
    """:func:`printable`, with ``rich`` markup escaped: for text placed into a string that
    ``console.print`` reads as markup."""
    from rich.markup import escape  # rich is what the CLI prints with; its own escaping is exact

    return escape(printable(text))
