"""The watermark strategy is chosen by config from one registry: mode x source kind."""

from __future__ import annotations

from typing import Any

import pytest

from airflow_dblog.engine.watermarks import STRATEGIES, watermark_strategy
from airflow_dblog.errors import ConfigError, SourceError
from airflow_dblog.sources.mysql.watermarks import (
    GtidWatermarks,
    MariaDbSnapshotWatermarks,
    MysqlTableWatermarks,
)
from airflow_dblog.sources.postgres.watermarks import (
    PostgresSnapshotWatermarks,
    PostgresTableWatermarks,
)


class Server:
    """Records the start-up checks a strategy asks of its source."""

    def __init__(self, kind: str, flavor: str = "mariadb") -> None:
        self.kind, self.flavor, self.where = kind, flavor, "127.0.0.1:3306"
        self.asked: list[str] = []

    def __getattr__(self, name: str) -> Any:
        return lambda *args: self.asked.append(name)


@pytest.mark.parametrize(
    ("mode", "kind", "strategy", "checks"),
    [
        ("table", "mysql", MysqlTableWatermarks, ["ensure_watermark_table", "check_commit_order"]),
        ("table", "postgres", PostgresTableWatermarks, ["ensure_watermark_table"]),
        ("gtid", "mysql", GtidWatermarks, ["refuse_gtid_watermarks"]),
        ("snapshot", "mysql", MariaDbSnapshotWatermarks, []),
        ("snapshot", "postgres", PostgresSnapshotWatermarks, []),
    ],
)
def test_each_mode_and_kind_has_its_strategy_checked_at_start(
    mode: str, kind: str, strategy: type, checks: list[str]
) -> None:
    server = Server(kind)
    chosen = watermark_strategy(mode, server, "s")  # type: ignore[arg-type]
    assert type(chosen) is strategy and chosen.stream == "s"
    assert server.asked == checks
    assert len(STRATEGIES) == 5


def test_a_mode_the_kind_has_not_is_one_line_naming_the_ones_it_has() -> None:
    with pytest.raises(ConfigError, match="'gtid' is not available on postgres") as err:
        watermark_strategy("gtid", Server("postgres"), "s")  # type: ignore[arg-type]
    assert "snapshot, table" in str(err.value) and "\n" not in str(err.value)


def test_mariadb_snapshot_watermarks_refuse_mysql() -> None:
    with pytest.raises(SourceError, match="needs MariaDB"):
        watermark_strategy("snapshot", Server("mysql", "mysql"), "s")  # type: ignore[arg-type]
