"""The config file: defaults, interpolation, and a one-line error for every malformed input."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from airflow_dblog.config import load_config, parse_config
from airflow_dblog.core.events import TableId
from airflow_dblog.errors import ConfigError

VALID = """
name: inventory
source:
  type: mysql
  url: mysql://dblog:${DB_PASSWORD}@127.0.0.1:3306/app
  tables: [app.orders, app.customers]
  watermark: table
metadata:
  url: sqlite:///./dblog-meta.db
dump: {chunk_size: 10000, delay_ms: 0, parallelism: 1}
sinks:
  delta: {path: ./out/delta}
  kafka: {bootstrap_servers: 127.0.0.1:9092, topic_prefix: inventory}
checkpoint: ./out/checkpoint
ha: {zookeeper: 127.0.0.1:2181}
"""


def test_design_example_parses_with_paths_relative_to_the_file(tmp_path: Path) -> None:
    file = tmp_path / "dblog.yaml"
    file.write_text(VALID)
    config = load_config(file, env={"DB_PASSWORD": "s3cret"})
    assert config.name == "inventory"
    assert config.source.url == "mysql://dblog:s3cret@127.0.0.1:3306/app"
    assert config.source.tables == (TableId("app", "orders"), TableId("app", "customers"))
    assert config.metadata_url == f"sqlite:///{tmp_path}/dblog-meta.db"
    assert config.delta is not None and config.delta.path == str(tmp_path / "out/delta")
    assert config.kafka is not None and config.kafka.image_mode == "NEW_AND_OLD_IMAGES"
    assert config.checkpoint == str(tmp_path / "out/checkpoint")
    assert config.ha is not None and config.ha.zookeeper == "127.0.0.1:2181"
    assert config.dump.chunk_size == 10000


@pytest.mark.parametrize(
    ("written", "read"),
    [
        ("s3a://lake/cdc/delta", "s3a://lake/cdc/delta"),
        ("abfss://c@acct.dfs.core.windows.net/delta", "abfss://c@acct.dfs.core.windows.net/delta"),
        ("gs://lake/delta", "gs://lake/delta"),
        ("hdfs://nn:8020/delta", "hdfs://nn:8020/delta"),
        ("file:///srv/delta", "/srv/delta"),
        ("./out/delta", "{dir}/out/delta"),
    ],
)
def test_an_object_store_delta_path_stays_a_uri(tmp_path: Path, written: str, read: str) -> None:
    file = tmp_path / "dblog.yaml"
    file.write_text(VALID.replace("path: ./out/delta", f"path: {written!r}"))
    config = load_config(file, env={"DB_PASSWORD": "pw"})
    assert config.delta is not None and config.delta.path == read.format(dir=tmp_path)


@pytest.mark.parametrize(
    "written",
    ["s3a://lake/cdc/cp", "abfss://c@acct.dfs.core.windows.net/cp", "gs://b/cp", "hdfs://nn/cp"],
)
def test_an_object_store_checkpoint_stays_a_uri(written: str) -> None:
    """The spool and Spark's checkpoint live there (the metadata default stays a local file)."""
    text = VALID.replace("checkpoint: ./out/checkpoint", f"checkpoint: {written!r}")
    assert parse_config(text, env={"DB_PASSWORD": "pw"}).checkpoint == written


def test_a_file_uri_checkpoint_is_a_local_path(tmp_path: Path) -> None:
    file = tmp_path / "dblog.yaml"
    file.write_text(VALID.replace("checkpoint: ./out/checkpoint", "checkpoint: file:///srv/cp"))
    assert load_config(file, env={"DB_PASSWORD": "pw"}).checkpoint == "/srv/cp"


def test_defaults_and_env_default_syntax() -> None:
    config = parse_config(
        textwrap.dedent(
            """
            name: pg1
            source:
              type: postgres
              url: postgresql://u:${PW:-dflt}@h/db
              tables: [public.t]
            sinks: {delta: {path: /x}}
            checkpoint: /cp
            """
        ),
        env={},
    )
    assert config.source.url == "postgresql://u:dflt@h/db"
    assert config.source.watermark == "table"
    assert (config.dump.chunk_size, config.dump.delay_ms, config.dump.parallelism) == (10000, 0, 1)
    assert config.kafka is None and config.ha is None
    assert config.delta is not None and config.delta.deletion_vectors
    assert config.delta.batch_wait_s == 5.0 and config.delta.warm_up
    assert config.metadata_url.endswith("/dblog-meta.db")


def test_airflow_connection_id_may_stand_in_for_url() -> None:
    text = VALID.replace("mysql://dblog:${DB_PASSWORD}@127.0.0.1:3306/app", "my_mysql_conn")
    assert parse_config(text, env={}).source.is_airflow_conn


def _edit(old: str, new: str) -> str:
    assert old in VALID, old
    return VALID.replace(old, new)


MALFORMED = [
    ("not yaml", "name: [unclosed", "not valid YAML"),
    ("not a mapping", "- a\n- b", "must be a YAML mapping"),
    ("missing name", _edit("name: inventory\n", ""), "name is missing"),
    ("bad name", _edit("name: inventory", "name: 'in ventory'"), "not a valid stream name"),
    ("unknown top key", VALID + "colour: blue\n", "unknown key colour"),
    (
        "unknown nested key",
        _edit("watermark: table", "watermark: table\n  wtermark: x"),
        "unknown key source.wtermark",
    ),
    (
        "bad source type",
        _edit("type: mysql", "type: oracle"),
        "source.type must be one of mysql, postgres",
    ),
    (
        "bad watermark",
        _edit("watermark: table", "watermark: magic"),
        "source.watermark must be one of",
    ),
    (
        "gtid on postgres",
        _edit("type: mysql", "type: postgres")
        .replace("mysql://", "postgres://")
        .replace("watermark: table", "watermark: gtid"),
        "gtid needs a MySQL",
    ),
    ("scheme mismatch", _edit("mysql://dblog", "postgres://dblog"), "does not match source.type"),
    ("missing env var", VALID, "environment variable DB_PASSWORD is not set"),
    (
        "tables not list",
        _edit("[app.orders, app.customers]", "app.orders"),
        "source.tables must be",
    ),
    ("empty tables", _edit("[app.orders, app.customers]", "[]"), "source.tables is empty"),
    ("table without db", _edit("app.orders,", "orders,"), "must be written as db.table"),
    ("duplicate table", _edit("app.customers]", "app.orders]"), "lists a table twice"),
    (
        "chunk size zero",
        _edit("chunk_size: 10000", "chunk_size: 0"),
        "dump.chunk_size must be between 1",
    ),
    (
        "chunk size text",
        _edit("chunk_size: 10000", "chunk_size: lots"),
        "dump.chunk_size must be an integer",
    ),
    (
        "chunk size bool",
        _edit("chunk_size: 10000", "chunk_size: true"),
        "dump.chunk_size must be an integer",
    ),
    ("negative delay", _edit("delay_ms: 0", "delay_ms: -5"), "dump.delay_ms must be between 0"),
    (
        "no sinks",
        _edit(
            "  delta: {path: ./out/delta}\n"
            "  kafka: {bootstrap_servers: 127.0.0.1:9092, topic_prefix: inventory}\n",
            "  {}\n",
        ),
        "sinks has neither delta nor kafka",
    ),
    (
        "kafka without prefix",
        _edit(", topic_prefix: inventory", ""),
        "sinks.kafka.topic_prefix is missing",
    ),
    (
        "bad image mode",
        _edit("topic_prefix: inventory}", "topic_prefix: inventory, image_mode: ALL}"),
        "sinks.kafka.image_mode must be one of",
    ),
    ("missing checkpoint", _edit("checkpoint: ./out/checkpoint\n", ""), "checkpoint is missing"),
    (
        "source not mapping",
        _edit("source:\n  type: mysql", "source: mysql\nxsource:\n  type: mysql"),
        "source must be a mapping",
    ),
    (
        "empty url",
        _edit("mysql://dblog:${DB_PASSWORD}@127.0.0.1:3306/app", "''"),
        "source.url is empty",
    ),
    (
        "deletion vectors text",
        _edit("{path: ./out/delta}", "{path: ./out/delta, deletion_vectors: yes please}"),
        "sinks.delta.deletion_vectors must be true or false",
    ),
    (
        "warm-up text",
        _edit("{path: ./out/delta}", "{path: ./out/delta, warm_up: later}"),
        "sinks.delta.warm_up must be true or false",
    ),
    (
        "negative batch wait",
        _edit("{path: ./out/delta}", "{path: ./out/delta, batch_wait_s: -1}"),
        "sinks.delta.batch_wait_s must be between 0 and 3600 seconds, got -1",
    ),
    (
        "zero session timeout",
        _edit("{zookeeper: 127.0.0.1:2181}", "{zookeeper: 127.0.0.1:2181, session_timeout_s: 0}"),
        "ha.session_timeout_s must be between 1 and 600 seconds, got 0",
    ),
    (
        "batch wait text",
        _edit("{path: ./out/delta}", "{path: ./out/delta, batch_wait_s: soon}"),
        "sinks.delta.batch_wait_s must be an integer or float, got 'soon'",
    ),
    (
        "slot on mysql",
        _edit("watermark: table", "watermark: table\n  slot: s1"),
        "source.slot must be",
    ),
]


@pytest.mark.parametrize(("case", "text", "message"), MALFORMED, ids=[m[0] for m in MALFORMED])
def test_malformed_config_gives_one_line_error(case: str, text: str, message: str) -> None:
    env = {} if case == "missing env var" else {"DB_PASSWORD": "pw"}
    with pytest.raises(ConfigError) as info:
        parse_config(text, env=env)
    error = str(info.value)
    assert message in error
    assert "\n" not in error


def test_unreadable_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read config file"):
        load_config(tmp_path / "missing.yaml")


@pytest.mark.parametrize("name", ["dblog.yaml", "dblog-cluster.yaml"])
def test_the_docker_configs_load(name: str) -> None:
    """docker/ cannot run here; its configs at least parse as they ship."""
    config = load_config(Path(__file__).parents[2] / "docker" / name, env={})
    assert config.name == "inventory"
    if name == "dblog-cluster.yaml":
        assert config.checkpoint == "s3a://dblog/inventory/checkpoint"
        assert config.delta is not None and config.delta.path == "s3a://dblog/inventory/delta"
