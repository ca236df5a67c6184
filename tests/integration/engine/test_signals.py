"""Kafka signals applied from a real topic exactly once."""

from __future__ import annotations

import time
import uuid
from pathlib import Path
from typing import Any

import pytest

from airflow_dblog.config import Config, parse_config
from airflow_dblog.engine.metadata import MetadataStore
from airflow_dblog.engine.signals import SignalChannel
from tests.unit.engine.test_signals import _doc


def _config(mysql_db: Any, kafka_server: Any, tmp_path: Path, topic: str) -> Config:
    return parse_config(
        f"""
name: sig-{uuid.uuid4().hex[:8]}
source: {{type: mysql, url: "{mysql_db.url}", tables: [{mysql_db.name}.t]}}
metadata: {{url: "sqlite:///{tmp_path}/meta.db"}}
sinks:
  kafka:
    bootstrap_servers: "{kafka_server.bootstrap_servers}"
    topic_prefix: p
    signal_topic: {topic}
checkpoint: {tmp_path}/cp
""",
        env={},
    )


def _send(kafka_server: Any, topic: str, key: str, values: list[bytes]) -> None:
    from confluent_kafka import Producer

    producer = Producer(kafka_server.config())
    for value in values:
        producer.produce(topic, key=key.encode(), value=value)
    producer.flush(30)


def _poll_until(channel: SignalChannel, done: Any, timeout_s: float = 30) -> None:
    deadline = time.monotonic() + timeout_s
    while not done():
        assert time.monotonic() < deadline, "signals were not applied in time"
        channel.poll()
        time.sleep(0.2)


@pytest.mark.integration
def test_signals_from_a_real_topic_drive_dumps_once(
    mysql_db: Any, kafka_server: Any, kafka_topic: str, tmp_path: Path
) -> None:
    with mysql_db.connect() as conn, conn.cursor() as cur:
        cur.execute(f"CREATE TABLE `{mysql_db.name}`.t (id INT PRIMARY KEY)")
        cur.execute(f"INSERT INTO `{mysql_db.name}`.t VALUES (1), (2), (3)")
        conn.commit()
    config = _config(mysql_db, kafka_server, tmp_path, kafka_topic)
    store = MetadataStore(config.metadata_url)
    table = f"{mysql_db.name}.t"
    execute = _doc("execute-snapshot", **{"data-collections": [table], "type": "INCREMENTAL"})
    _send(kafka_server, kafka_topic, "another-stream", [execute])  # not ours: passed over
    _send(
        kafka_server,
        kafka_topic,
        config.name,
        [
            b"{broken",
            _doc("execute-snapshot", **{"data-collections": [f"{mysql_db.name}.missing"]}),
            execute,
            b'{"type": "pause-snapshot"}',
        ],
    )
    channel = SignalChannel(config, store)
    _poll_until(channel, lambda: channel.applied + channel.skipped >= 4)
    (dump,) = store.dumps(config.name)
    assert dump.state == "paused" and dump.requested_by.startswith(f"kafka-signal {kafka_topic}/0@")
    assert (channel.applied, channel.skipped) == (2, 2)

    _send(kafka_server, kafka_topic, config.name, [b'{"type": "resume-snapshot"}'])
    _poll_until(channel, lambda: store.dump(dump.id).state == "pending")
    _send(
        kafka_server,
        kafka_topic,
        config.name,
        [_doc("stop-snapshot", **{"data-collections": [table]})],
    )
    _poll_until(channel, lambda: store.dump(dump.id).state == "cancelled")
    channel.close()

    # a restart resumes after the last committed signal: nothing is applied again
    again = SignalChannel(config, store)
    _send(kafka_server, kafka_topic, config.name, [b'{"type": "pause-snapshot"}'])
    _poll_until(again, lambda: again.applied + again.skipped >= 1)
    assert again.applied + again.skipped == 1
    assert len(store.dumps(config.name)) == 1
    again.close()
