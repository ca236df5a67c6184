"""Debezium-format signals on a Kafka topic: start, stop, pause and resume dumps.

Messages keyed by the stream's name are read from ``sinks.kafka.signal_topic`` (others are for
other streams and are passed over)::

    {"type": "execute-snapshot", "data": {"data-collections": ["db.table"], "type": "INCREMENTAL"}}
    {"type": "execute-snapshot", "data": {"data-collections": ["db.table"], "verify": "dry-run"}}
    {"type": "stop-snapshot", "data": {"data-collections": ["db.table"]}}   # or no data: all
    {"type": "pause-snapshot"}
    {"type": "resume-snapshot"}

``verify`` (``repair`` or ``dry-run``; dblog's own, Debezium has none) makes it a verify dump.
A signal is applied, then its offset committed: a restart never loses one. A dump started by a
signal records ``kafka-signal <topic>/<partition>@<offset>`` as who asked, so a signal applied
just before a crash is not applied twice. A malformed signal is logged and skipped.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass

from airflow_dblog.config import Config
from airflow_dblog.engine.kafka_admin import ensure_topics
from airflow_dblog.engine.metadata import MetadataStore
from airflow_dblog.engine.metadata.models import VERIFY_MODES
from airflow_dblog.engine.planner import plan_dump
from airflow_dblog.errors import DblogError

log = logging.getLogger(__name__)

ACTIVE = ("pending", "running", "paused")


class SignalError(DblogError):
    """A signal message that cannot be applied as written."""


@dataclass(frozen=True)
class Signal:
    type: str
    tables: tuple[str, ...] | None  # None: every table (execute) or every dump (stop)
    verify: str | None = None  # execute-snapshot: a verify dump in this mode


def parse_signal(value: bytes | None) -> Signal:
    """The signal in a message value; SignalError naming what is wrong."""
    try:
        doc = json.loads(value or b"")
    except (ValueError, UnicodeDecodeError):
        raise SignalError("signal is not JSON") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("type"), str):
        raise SignalError('signal has no "type"')
    kind = doc["type"]
    if kind not in ("execute-snapshot", "stop-snapshot", "pause-snapshot", "resume-snapshot"):
        raise SignalError(f"signal type {kind!r} is not supported")
    data = doc.get("data") or {}
    if not isinstance(data, dict):
        raise SignalError('signal "data" is not an object')
    snapshot = data.get("type", "INCREMENTAL")
    if not isinstance(snapshot, str) or snapshot.upper() != "INCREMENTAL":
        raise SignalError(f"snapshot type {snapshot!r} is not supported (INCREMENTAL is)")
    verify = data.get("verify")
    if verify is not None and (kind != "execute-snapshot" or verify not in VERIFY_MODES):
        raise SignalError(
            f'"verify" {verify!r} is not supported here: an execute-snapshot signal takes'
            f" {' or '.join(VERIFY_MODES)}"
        )
    collections = data.get("data-collections")
    if collections is None:
        if kind == "execute-snapshot":
            raise SignalError('execute-snapshot needs "data-collections"')
        return Signal(kind, None)
    if not isinstance(collections, list) or not all(isinstance(c, str) for c in collections):
        raise SignalError('"data-collections" must be a list of "db.table" names')
    return Signal(kind, tuple(collections), verify)


class SignalChannel:
    """Polled by the capture loop; never blocks it and never lets a bad message stop it."""

    def __init__(self, config: Config, store: MetadataStore) -> None:
        from confluent_kafka import Consumer

        assert config.kafka is not None and config.kafka.signal_topic
        self.config, self.store = config, store
        self.topic = config.kafka.signal_topic
        servers = config.kafka.bootstrap_servers
        ensure_topics(servers, {self.topic: 1})
        self.consumer = Consumer(
            {
                "bootstrap.servers": servers,
                "group.id": f"dblog-{config.name}-signals",
                "enable.auto.commit": False,
                "auto.offset.reset": "earliest",
                "isolation.level": "read_committed",
            }
        )
        self.consumer.subscribe([self.topic])
        self.applied = 0
        self.skipped = 0

    def poll(self, max_messages: int = 10) -> None:
        for _ in range(max_messages):
            msg = self.consumer.poll(0)
            if msg is None:
                return
            if msg.error():
                log.warning("signal topic %s: %s", self.topic, msg.error())
                return
            where = f"{msg.topic()}/{msg.partition()}@{msg.offset()}"
            if (msg.key() or b"").decode(errors="replace") == self.config.name:
                self._apply(msg.value(), where)
            self.consumer.commit(message=msg, asynchronous=False)

    def _apply(self, value: bytes | None, where: str) -> None:
        try:
            signal = parse_signal(value)
            self._run(signal, f"kafka-signal {where}")
            self.applied += 1
            log.info("signal %s applied: %s %s", where, signal.type, signal.tables or "all")
        except DblogError as err:  # bad table names reach here too, as InputError
            self.skipped += 1
            log.warning("signal %s skipped: %s", where, err)

    def _run(self, signal: Signal, requested_by: str) -> None:
        dumps = self.store.dumps(self.config.name)
        if signal.type == "execute-snapshot":
            if any(d.requested_by == requested_by for d in dumps):
                return  # applied before a restart, offset not yet committed
            tables = list(signal.tables or ())
            plan_dump(
                self.config, self.store, tables, requested_by=requested_by, verify=signal.verify
            )
            return
        action, states = {
            "stop-snapshot": ("cancel", ACTIVE),
            "pause-snapshot": ("pause", ("pending", "running")),
            "resume-snapshot": ("resume", ("paused",)),
        }[signal.type]
        wanted = set(signal.tables) if signal.tables else None
        for dump in dumps:
            if dump.state not in states:
                continue
            tables = {t.table_name for t in self.store.dump_tables(dump.id)}
            if wanted is None or tables & wanted:
                self.store.apply(dump.id, action, reason=f"{signal.type} signal")

    def close(self) -> None:
        self.consumer.close()
