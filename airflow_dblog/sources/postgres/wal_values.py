"""WAL values (wal2json's JSON) as the Python values a SELECT through psycopg2 returns.

Both sides go through psycopg2's own typecasters, looked up by the type OID wal2json reports
(``include-type-oids``); the common types with a fixed conversion skip the caster. bytea comes
back as ``bytes`` on both sides (psycopg2's ``memoryview`` is converted), also inside arrays.
"""

from __future__ import annotations

import decimal
import json
from collections.abc import Callable
from typing import Any

import psycopg2.extensions

Converter = Callable[[Any], Any]


def bytes_deep(value: Any) -> Any:
    """psycopg2's ``memoryview`` for bytea as ``bytes``, also inside arrays (SELECT and WAL)."""
    if isinstance(value, memoryview):
        return value.tobytes()
    if isinstance(value, list):
        return [bytes_deep(v) for v in value]
    return value


# type OIDs with a fixed conversion of wal2json's JSON value (psycopg2's default casters agree)
_INT_OIDS = frozenset({20, 21, 23, 26})
_FLOAT_OIDS = frozenset({700, 701})
_STR_OIDS = frozenset({18, 19, 25, 1042, 1043})
_BOOL_OID, _BYTEA_OID, _NUMERIC_OID = 16, 17, 1700  # uuid: str unless a caster is registered
_JSON_OIDS = frozenset({114, 3802})


def identity(value: Any) -> Any:
    return value


def _to_float(value: Any) -> float:
    return float(value)


def _to_decimal(value: Any) -> decimal.Decimal:
    return decimal.Decimal(value)


def _from_hex(value: str) -> bytes:
    return bytes.fromhex(value)


def value_converter(oid: int, base: int, cursor: Any) -> Converter:
    """How to convert wal2json's value of a column of type ``oid`` (``base``: the base type of a
    domain, else ``oid``); ``cursor``: the replication cursor psycopg2's casters are given."""
    casters = psycopg2.extensions.string_types
    if base != oid:
        # a domain: wal2json prints it as the base type's text (quoted, bytea with \x),
        # so psycopg2's caster of the base type reads it exactly like a SELECT does
        domain_caster = casters.get(base)
        if domain_caster is None:
            return identity

        def cast_domain(value: Any) -> Any:
            text = value if isinstance(value, str) else str(value)
            return bytes_deep(domain_caster(text, cursor))

        return cast_domain
    if base in _INT_OIDS or base == _BOOL_OID:
        return identity
    if base in _STR_OIDS:
        return identity
    if base in _FLOAT_OIDS:
        return _to_float
    if base == _NUMERIC_OID:
        return _to_decimal
    if base == _BYTEA_OID:
        return _from_hex
    if base in _JSON_OIDS and casters.get(base) is not None:
        return json.loads
    caster = casters.get(base)
    if caster is None:
        return identity  # enums, composites, ...: psycopg2 returns the text too

    def cast(value: Any) -> Any:
        return bytes_deep(caster(value if isinstance(value, str) else str(value), cursor))

    return cast
