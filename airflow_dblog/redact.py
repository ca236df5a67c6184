"""Keep passwords out of logs, exceptions and status output."""

from __future__ import annotations

import re

_URL_PASSWORD = re.compile(r"(?P<head>[A-Za-z][A-Za-z0-9+.-]*://[^:/@\s]*):(?P<pw>[^@\s]*)@")


def redact(text: str) -> str:
    """Replace the password of every ``scheme://user:password@`` in ``text`` with ``***``."""
    return _URL_PASSWORD.sub(lambda m: f"{m.group('head')}:***@", text)
