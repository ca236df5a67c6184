"""Kafka topic creation, shared by the Kafka sink (its table and marker topics) and the signal
channel (its signal topic), so neither depends on the other."""

from __future__ import annotations

import logging
from collections.abc import Mapping

from airflow_dblog.errors import DblogError

log = logging.getLogger(__name__)

TIMEOUT_S = 30.0


class KafkaAdminError(DblogError):
    """The brokers could not list topics, or refused to create one."""


def ensure_topics(
    bootstrap_servers: str,
    partitions: Mapping[str, int],
    configs: Mapping[str, Mapping[str, str]] | None = None,
) -> None:
    """Create the topics that do not exist yet (broker-default replication)."""
    from confluent_kafka import KafkaException
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": bootstrap_servers})
    try:
        existing = set(admin.list_topics(timeout=TIMEOUT_S).topics)
    except KafkaException as err:
        raise KafkaAdminError(
            f"Kafka at {bootstrap_servers} could not list topics: {err.args[0]}",
            "check that the brokers are up",
        ) from None
    missing = [
        NewTopic(t, n, replication_factor=-1, config=dict((configs or {}).get(t, {})))
        for t, n in partitions.items()
        if t not in existing
    ]
    if not missing:
        return
    for topic, future in admin.create_topics(missing, request_timeout=TIMEOUT_S).items():
        try:
            future.result()
            log.info("kafka: created topic %s", topic)
        except Exception as err:
            if "TOPIC_ALREADY_EXISTS" not in str(err):
                raise KafkaAdminError(
                    f"Kafka topic {topic} cannot be created: {err}",
                    "create it, or give the stream's user CreateTopics on the cluster",
                ) from None
