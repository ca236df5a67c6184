"""What a PostgreSQL source knows of a table: its columns as the catalogs describe them (base
types of domains resolved), its primary key and its replica identity."""

from __future__ import annotations

from dataclasses import dataclass

from airflow_dblog.sources.base import TableSchema


@dataclass(frozen=True)
class ColumnInfo:
    name: str
    type: str  # format_type(), e.g. "character varying(20)"
    nullable: bool
    type_oid: int  # the base type's OID (domains resolved): what psycopg2 and the reader see
    base_type: str  # the base type's pg_type.typname, e.g. "int4", "varchar", "timestamptz"
    category: str  # pg_type.typcategory of the base type
    max_length: int | None  # varchar(n)/char(n)
    scale: int | None = None  # numeric(p, s)


@dataclass(frozen=True)
class TableInfo:
    oid: int
    schema: TableSchema
    columns: dict[str, ColumnInfo]
    replica_identity: str  # d(efault), f(ull), i(ndex), n(othing)
    loaded_at: float

    def column(self, name: str) -> ColumnInfo:
        return self.columns[name]
