"""How a SELECT's text values become Python values: PyMySQL's types, parsed faster.

A dumped row must compare equal to the same row decoded from the binlog, so the types stay
PyMySQL's (``binlog_codecs`` decodes the binlog into them). Only the parse of dates and times
changes: the server sends them in ISO form, which ``fromisoformat`` reads in C, where PyMySQL runs
a regular expression and a Python loop per value. Whatever ``fromisoformat`` refuses (zero dates,
invalid dates a lax ``sql_mode`` stored) goes to PyMySQL's own converter, which returns it as
text.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

from pymysql.constants import FIELD_TYPE
from pymysql.converters import conversions, convert_date, convert_datetime

_DATETIME_TEXT = len("2000-01-01 00:00:00")
_DATE_TEXT = len("2000-01-01")


def to_datetime(text: str) -> dt.datetime | str:
    if len(text) >= _DATETIME_TEXT:
        try:
            return dt.datetime.fromisoformat(text)
        except ValueError:
            pass
    return convert_datetime(text)


def to_date(text: str) -> dt.date | str:
    if len(text) == _DATE_TEXT:
        try:
            return dt.date.fromisoformat(text)
        except ValueError:
            pass
    return convert_date(text)


CONVERSIONS: dict[Any, Any] = {
    **conversions,
    FIELD_TYPE.DATETIME: to_datetime,
    FIELD_TYPE.TIMESTAMP: to_datetime,
    FIELD_TYPE.DATE: to_date,
}
