"""Chunk SELECTs through mysqlclient when it is installed: the C client library parses the rows.

PyMySQL parses every row of a result in Python, which is most of what a chunk worker spends on
a chunk of narrow rows. mysqlclient (the ``mysqlclient`` extra; it builds against libmariadb or
libmysqlclient) hands each value to the same converters as :mod:`.text_values` (numbers in C),
so a row reads the same through either driver, types included. Only the plain chunk SELECTs use
it: watermarks, schema, positions and snapshot chunks stay on the source's PyMySQL connection.

The source reads its errors as the PyMySQL error of the same DB-API class and arguments
(:func:`as_pymysql`), so its one reconnect-and-retry and its one-line errors apply to both
connections alike.
"""

from __future__ import annotations

import contextlib
from typing import Any

import pymysql
from pymysql.constants import FIELD_TYPE

from airflow_dblog.sources.mysql.connection import ConnectionSettings
from airflow_dblog.sources.mysql.text_values import CONVERSIONS

try:
    import MySQLdb
    import MySQLdb.converters
except ImportError:  # the extra is not installed: PyMySQL reads the chunks
    MySQLdb = None

AVAILABLE = MySQLdb is not None
# what a chunk SELECT on this connection raises
ERRORS: tuple[type[Exception], ...] = (MySQLdb.Error,) if MySQLdb is not None else ()

# PyMySQL's decoders for the types it converts; text and bytes are left to mysqlclient, which
# decodes non-binary text itself (SET too: mysqlclient's own converter would make it a set).
_DECODED = (
    FIELD_TYPE.TIMESTAMP,
    FIELD_TYPE.DATETIME,
    FIELD_TYPE.DATE,
    FIELD_TYPE.TIME,
    FIELD_TYPE.DECIMAL,
    FIELD_TYPE.NEWDECIMAL,
)


def _conversions() -> dict[Any, Any]:
    assert MySQLdb is not None
    conv = dict(MySQLdb.converters.conversions)
    conv.update({kind: CONVERSIONS[kind] for kind in _DECODED})
    conv.pop(FIELD_TYPE.SET, None)
    return conv


def as_pymysql(err: Exception) -> pymysql.MySQLError:
    """A mysqlclient error as PyMySQL's error of the same DB-API class (a PyMySQL one as is)."""
    if isinstance(err, pymysql.MySQLError):
        return err
    kind = getattr(pymysql.err, type(err).__name__, pymysql.err.OperationalError)
    return kind(*err.args)  # type: ignore[no-any-return]


class CRows:
    """One mysqlclient connection for chunk SELECTs, opened when first asked for."""

    def __init__(
        self, settings: ConnectionSettings, read_timeout: float | None, init_command: str
    ) -> None:
        self.settings = settings
        self._read_timeout = read_timeout
        self._init_command = init_command
        self._conn: Any = None

    def connection(self) -> Any:
        if self._conn is None:
            kwargs = self.settings.pymysql_kwargs()  # same names; mysqlclient wants whole seconds
            kwargs["connect_timeout"] = max(1, round(self.settings.connect_timeout))
            if self._read_timeout:
                kwargs["read_timeout"] = kwargs["write_timeout"] = max(1, round(self._read_timeout))
            self._conn = MySQLdb.connect(  # type: ignore[union-attr]
                **kwargs, autocommit=True, init_command=self._init_command, conv=_conversions()
            )
        return self._conn

    def close(self) -> None:
        if self._conn is not None:
            with contextlib.suppress(Exception):
                self._conn.close()
            self._conn = None
