"""What a finished dump refreshed, as Airflow Assets and as OpenLineage datasets.

One Asset per Delta table and per Kafka topic a dump wrote. An Asset's URI is where the data
is, so any other DAG that reads or writes the same place names the same Asset:

- a Delta table: its storage location, ``<sinks.delta.path>/<db>/<table>``, as a URI:
  ``file:///data/delta/app/orders`` for a local path, ``s3://bucket/delta/app/orders`` for
  ``s3a://`` (and ``s3n://``; Airflow and OpenLineage know S3 as ``s3``), ``gs://...``,
  ``abfss://...``, ``hdfs://...`` as they are written;
- a Kafka topic: ``kafka://<first bootstrap server>/<prefix>.<db>.<table>``, the form of
  Airflow's Kafka provider.

The name of each Asset is its URI (Airflow's default), so ``Asset("file:///data/delta/app/
orders")`` in a downstream DAG is the same Asset. OpenLineage names follow its naming spec:
the source table (``mysql://host:port`` + ``db.table``, ``postgres://host:port`` +
``database.schema.table``) in, the Delta locations and topics out.

Everything but :func:`dblog_assets` is plain Python.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote, unquote, urlsplit

from airflow_dblog.config import Config
from airflow_dblog.core.events import TableId
from airflow_dblog.sinks.delta_sink import table_path
from airflow_dblog.sinks.kafka_sink import topic_name
from airflow_dblog.sources.registry import source_kind

SINKS = ("delta", "kafka")
_SCHEME_ALIASES = {"s3a": "s3", "s3n": "s3"}
# object stores: OpenLineage names an object by its key, without the leading slash
_OBJECT_STORES = {"s3", "gs", "gcs", "abfs", "abfss", "wasb", "wasbs", "oss"}


@dataclass(frozen=True)
class Refreshed:
    """One place a dump of ``table`` wrote to."""

    sink: str  # delta | kafka
    table: TableId
    uri: str


def storage_uri(location: str) -> str:
    """A Delta table's location as an Asset URI (a bare path becomes ``file://``)."""
    parts = urlsplit(location)
    if len(parts.scheme) > 1 and location.startswith(f"{parts.scheme}:"):
        scheme = parts.scheme.lower()
        scheme = _SCHEME_ALIASES.get(scheme, scheme)
        if scheme == "file":
            return f"file://{quote(unquote(parts.path))}"
        return f"{scheme}://{parts.netloc}{quote(unquote(parts.path))}"
    return f"file://{quote(os.path.abspath(location))}"


def kafka_uri(bootstrap_servers: str, topic: str) -> str:
    server = bootstrap_servers.split(",")[0].strip()
    server = server.split("://", 1)[-1]  # SASL_SSL://host:9093
    return f"kafka://{server}/{quote(topic, safe='')}"


def refreshed(
    config: Config, tables: Iterable[TableId | str] | None = None, sinks: Sequence[str] = SINKS
) -> list[Refreshed]:
    """Every Delta table and Kafka topic a dump of ``tables`` (default: all captured) writes."""
    if tables is None:
        tables = config.source.tables
    out = []
    for table in (TableId.parse(t) if isinstance(t, str) else t for t in tables):
        if config.delta is not None and "delta" in sinks:
            location = table_path(config.delta, table)
            out.append(Refreshed("delta", table, storage_uri(location)))
        if config.kafka is not None and "kafka" in sinks:
            topic = topic_name(config.kafka.topic_prefix, table)
            out.append(Refreshed("kafka", table, kafka_uri(config.kafka.bootstrap_servers, topic)))
    return out


def openlineage_name(uri: str) -> tuple[str, str]:
    """(namespace, name) of an output Asset URI, by OpenLineage's dataset naming."""
    parts = urlsplit(uri)
    path = unquote(parts.path)
    if parts.scheme == "file":
        return "file", path
    if parts.scheme == "kafka" or parts.scheme in _OBJECT_STORES:
        return f"{parts.scheme}://{parts.netloc}", path.lstrip("/")
    return f"{parts.scheme}://{parts.netloc}", path


def source_openlineage_name(kind: str, url: str, table: TableId) -> tuple[str, str]:
    """(namespace, name) of a captured source table; only host, port and database of ``url``."""
    return source_kind(kind).openlineage_name(url, table)


def openlineage_names(
    config: Config, tables: Iterable[TableId | str], source_url: str
) -> tuple[list[tuple[str, str]], list[tuple[str, str]]]:
    """(inputs, outputs) of a finished dump of ``tables`` as (namespace, name) pairs."""
    places = refreshed(config, tables)
    read = dict.fromkeys(p.table for p in places)
    inputs = [source_openlineage_name(config.source.type, source_url, t) for t in read]
    return inputs, [openlineage_name(p.uri) for p in places]


def dblog_assets(
    config: Config, tables: Iterable[TableId | str] | None = None, sinks: Sequence[str] = SINKS
) -> list[Any]:
    """The Assets a dump of ``tables`` (default: all captured) refreshes, for ``schedule=``."""
    from airflow_dblog.provider.compat import Asset

    return [Asset(p.uri) for p in refreshed(config, tables, sinks)]
