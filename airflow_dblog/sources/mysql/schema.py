"""What a MySQL/MariaDB source knows of a table: its columns as information_schema describes
them, and its primary key."""

from __future__ import annotations

from dataclasses import dataclass

from airflow_dblog.sources.base import TableSchema

BINARY_TYPES = {"binary", "varbinary", "tinyblob", "blob", "mediumblob", "longblob"}


@dataclass(frozen=True)
class ColumnInfo:
    """What the source knows of a column beyond ``base.Column``."""

    name: str
    data_type: str  # lower-case DATA_TYPE: int, varchar, decimal, ...
    column_type: str  # COLUMN_TYPE: int(11) unsigned, varchar(20), enum('a','b'), ...
    nullable: bool
    unsigned: bool
    charset: str | None  # None: binary or not a string
    char_length: int | None
    scale: int | None

    @property
    def is_binary(self) -> bool:
        return self.data_type in BINARY_TYPES


@dataclass(frozen=True)
class TableInfo:
    schema: TableSchema
    columns: tuple[ColumnInfo, ...]

    def column(self, name: str) -> ColumnInfo:
        for col in self.columns:
            if col.name == name:
                return col
        raise KeyError(name)
