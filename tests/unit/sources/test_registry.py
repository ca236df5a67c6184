"""Every source kind comes from one registry keyed by ``source.type``; no driver until used."""

from __future__ import annotations

import subprocess
import sys

import pytest

from airflow_dblog.core.events import TableId
from airflow_dblog.errors import ConfigError
from airflow_dblog.sources.registry import KINDS, open_reader, source_for, source_kind


def test_an_unknown_kind_is_one_line_config_error_naming_the_kinds() -> None:
    with pytest.raises(ConfigError, match="'oracle' is not a known source kind") as err:
        source_kind("oracle")
    assert "mysql, postgres" in str(err.value) and "\n" not in str(err.value)
    with pytest.raises(ConfigError, match="mysql, postgres"):
        source_for("oracle", "oracle://h/db")


def test_each_kind_names_a_source_a_reader_and_its_watermark_strategies() -> None:
    for kind in KINDS.values():
        strategies = kind.watermark_strategies()
        assert tuple(strategies) == kind.watermark_modes
        assert all(
            strategy.__module__.startswith(f"airflow_dblog.sources.{kind.name}.")
            for strategy in strategies.values()
        )
    assert KINDS["mysql"].source("mysql://u:p@127.0.0.1:1/db").kind == "mysql"
    assert KINDS["postgres"].source("postgres://u:p@127.0.0.1:1/db").kind == "postgres"


def test_the_facts_other_layers_need_come_from_the_kind() -> None:
    mysql, postgres = KINDS["mysql"], KINDS["postgres"]
    assert (mysql.debezium_connector, mysql.envelope_db_field) == ("mysql", "database")
    assert (postgres.debezium_connector, postgres.envelope_db_field) == ("postgresql", "schema")
    assert postgres.takes_slot and not mysql.takes_slot
    assert "gtid" in mysql.watermark_modes and "gtid" not in postgres.watermark_modes
    table = TableId("public", "orders")
    assert postgres.openlineage_name("postgresql://u:pw@pg.example/shop", table) == (
        "postgres://pg.example:5432",
        "shop.public.orders",
    )
    assert mysql.openlineage_name("mysql://u@db:3307/app", TableId("app", "o")) == (
        "mysql://db:3307",
        "app.o",
    )


def test_importing_the_registry_and_validating_a_config_imports_no_driver() -> None:
    code = (
        "import sys\n"
        "import airflow_dblog.sources, airflow_dblog.sources.registry, airflow_dblog.config\n"
        "import airflow_dblog.engine.watermarks\n"
        "loaded = [m for m in ('pymysql', 'psycopg2', 'pymysqlreplication') if m in sys.modules]\n"
        "assert not loaded, loaded\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_opening_a_reader_of_an_unknown_kind_fails_before_any_connection() -> None:
    with pytest.raises(ConfigError, match="not a known source kind"):
        open_reader("oracle", "oracle://h/db", None, None)  # type: ignore[arg-type]
