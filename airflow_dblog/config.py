"""The YAML config of one stream: load, interpolate ``${VAR}``, validate, apply defaults.

Every problem is reported as a :class:`ConfigError` whose one line names the key path (for
example ``source.watermark``) and what would fix it. Unknown keys are rejected so a typo never
silently falls back to a default.
"""

from __future__ import annotations

import difflib
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from airflow_dblog.core.events import TableId
from airflow_dblog.errors import ConfigError
from airflow_dblog.sources.registry import KINDS, SOURCE_TYPES, kinds_offering, watermark_modes

WATERMARKS = watermark_modes()
IMAGE_MODES = ("NEW_AND_OLD_IMAGES", "NEW_IMAGE", "OLD_IMAGE", "KEYS_ONLY")
_NAME_RE = re.compile(r"^[A-Za-z][A-Za-z0-9_-]{0,62}$")
_ENV_RE = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}")


@dataclass(frozen=True)
class SourceConfig:
    type: str
    url: str
    tables: tuple[TableId, ...]
    watermark: str = "table"
    slot: str | None = None  # PostgreSQL replication slot; defaults to dblog_<name>
    server_id: int | None = None  # MySQL replica server id; derived from the name if unset

    @property
    def is_airflow_conn(self) -> bool:
        """A value without ``://`` names an Airflow connection instead of a URL."""
        return "://" not in self.url


@dataclass(frozen=True)
class DumpSettings:
    chunk_size: int = 10_000
    delay_ms: int = 0
    parallelism: int = 1


@dataclass(frozen=True)
class DeltaSinkConfig:
    path: str
    tombstone_retention_hours: int = 168
    # new tables only: an update marks the old row instead of rewriting its file
    deletion_vectors: bool = True
    # a small batch waits this long for more events (each MERGE costs seconds of CPU)
    batch_wait_s: float = 5.0
    # rehearse a dump's Delta batches on a scratch table at start: a dump's first batch
    # then runs in a warm JVM
    warm_up: bool = True


@dataclass(frozen=True)
class KafkaSinkConfig:
    bootstrap_servers: str
    topic_prefix: str
    image_mode: str = "NEW_AND_OLD_IMAGES"
    signal_topic: str | None = None
    partitions: int = 1


@dataclass(frozen=True)
class HaConfig:
    zookeeper: str
    session_timeout_s: float = 10.0


@dataclass(frozen=True)
class SparkConfig:
    master: str = "local[*]"
    conf: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Config:
    name: str
    source: SourceConfig
    metadata_url: str
    dump: DumpSettings
    delta: DeltaSinkConfig | None
    kafka: KafkaSinkConfig | None
    checkpoint: str
    ha: HaConfig | None = None
    spark: SparkConfig = field(default_factory=SparkConfig)


def load_config(path: str | os.PathLike[str], env: Mapping[str, str] | None = None) -> Config:
    """Read and validate ``path``; relative paths in it are resolved against the file's folder."""
    file = Path(path)
    try:
        text = file.read_text()
    except OSError as err:
        raise ConfigError(
            f"cannot read config file {file}: {err.strerror}", "pass an existing file with -c"
        ) from None
    return parse_config(text, base_dir=file.resolve().parent, env=env)


def parse_config(
    text: str, base_dir: Path | None = None, env: Mapping[str, str] | None = None
) -> Config:
    try:
        raw = yaml.safe_load(text)
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark else ""
        raise ConfigError(f"config is not valid YAML{where}", "fix the YAML syntax") from None
    if not isinstance(raw, dict):
        raise ConfigError("config must be a YAML mapping", "start from the example in the README")
    raw = _interpolate(raw, os.environ if env is None else env, "")
    return _build(raw, base_dir or Path.cwd())


def _interpolate(value: Any, env: Mapping[str, str], where: str) -> Any:
    if isinstance(value, dict):
        return {k: _interpolate(v, env, _join(where, str(k))) for k, v in value.items()}
    if isinstance(value, list):
        return [_interpolate(v, env, f"{where}[{i}]") for i, v in enumerate(value)]
    if not isinstance(value, str):
        return value

    def substitute(match: re.Match[str]) -> str:
        name, default = match.group(1), match.group(2)
        if name in env:
            return env[name]
        if default is not None:
            return default
        raise ConfigError(
            f"{where}: environment variable {name} is not set",
            f"export {name} or write ${{{name}:-default}}",
        )

    return _ENV_RE.sub(substitute, value)


def _join(where: str, key: str) -> str:
    return f"{where}.{key}" if where else key


class _Section:
    """Typed reads from one mapping that remember which keys were used."""

    def __init__(self, raw: Any, where: str, required: bool = True) -> None:
        if raw is None and not required:
            raw = {}
        if not isinstance(raw, dict):
            raise ConfigError(f"{where or 'config'} must be a mapping", "see the README example")
        self.raw, self.where, self.used = raw, where, set[str]()

    def path(self, key: str) -> str:
        return _join(self.where, key)

    def get(
        self, key: str, kind: type | tuple[type, ...], default: Any = ..., *, hint: str = ""
    ) -> Any:
        self.used.add(key)
        if key not in self.raw or self.raw[key] is None:
            if default is ...:
                self._missing(key, hint)
            return default
        value = self.raw[key]
        kinds = kind if isinstance(kind, tuple) else (kind,)
        # bool is an int subclass: accept it only where a bool is asked for
        if isinstance(value, kinds) and (bool in kinds or not isinstance(value, bool)):
            return value
        names = (
            " or ".join(k.__name__ for k in kinds)
            .replace("str", "a string")
            .replace("int", "an integer")
            .replace("bool", "true or false")
        )
        raise ConfigError(f"{self.path(key)} must be {names}, got {value!r}")

    def _missing(self, key: str, hint: str) -> None:
        typo = difflib.get_close_matches(key, [str(k) for k in self.raw if k not in self.used], 1)
        if typo:
            raise ConfigError(f"unknown key {self.path(typo[0])}", f"did you mean {key}?")
        raise ConfigError(f"{self.path(key)} is missing", hint or f"add {self.path(key)}")

    def string(self, key: str, default: Any = ..., *, hint: str = "") -> Any:
        value = self.get(key, str, default, hint=hint)
        if isinstance(value, str) and not value.strip():
            raise ConfigError(f"{self.path(key)} is empty", hint or f"set {self.path(key)}")
        return value

    def integer(self, key: str, default: Any, *, minimum: int, maximum: int | None = None) -> int:
        value = self.get(key, int, default)
        if value < minimum or (maximum is not None and value > maximum):
            bound = f"between {minimum} and {maximum}" if maximum else f">= {minimum}"
            raise ConfigError(f"{self.path(key)} must be {bound}, got {value}")
        return value

    def seconds(self, key: str, default: float, *, minimum: float, maximum: float) -> float:
        value = float(self.get(key, (int, float), default))
        if not minimum <= value <= maximum:
            raise ConfigError(
                f"{self.path(key)} must be between {minimum:g} and {maximum:g} seconds,"
                f" got {value:g}"
            )
        return value

    def choice(self, key: str, choices: tuple[str, ...], default: Any = ...) -> str:
        value = self.string(key, default)
        if value not in choices:
            raise ConfigError(
                f"{self.path(key)} must be one of {', '.join(choices)}, got {value!r}"
            )
        return value

    def section(self, key: str, required: bool = True) -> _Section | None:
        self.used.add(key)
        if self.raw.get(key) is None:
            if required:
                self._missing(key, f"add a {key}: section")
            return None
        return _Section(self.raw[key], self.path(key))

    def done(self) -> None:
        unknown = sorted(set(map(str, self.raw)) - self.used)
        if unknown:
            raise ConfigError(
                f"unknown key {self.path(unknown[0])}",
                f"remove it or check its spelling (allowed here: {', '.join(sorted(self.used))})",
            )


def _build(raw: dict[str, Any], base_dir: Path) -> Config:
    top = _Section(raw, "")
    name = top.string("name")
    if not _NAME_RE.match(name):
        raise ConfigError(
            f"name {name!r} is not a valid stream name",
            "use letters, digits, _ or -, starting with a letter (it names topics and paths)",
        )
    source = _source(top.section("source"), name)
    meta = top.section("metadata", required=False)
    metadata_url = _resolve_url(
        meta.string("url", "sqlite:///./dblog-meta.db") if meta else "sqlite:///./dblog-meta.db",
        base_dir,
    )
    if meta:
        meta.done()
    dump = top.section("dump", required=False)
    settings = DumpSettings()
    if dump:
        settings = DumpSettings(
            chunk_size=dump.integer("chunk_size", 10_000, minimum=1, maximum=10_000_000),
            delay_ms=dump.integer("delay_ms", 0, minimum=0, maximum=3_600_000),
            parallelism=dump.integer("parallelism", 1, minimum=1, maximum=64),
        )
        dump.done()
    delta, kafka = _sinks(top.section("sinks"), base_dir)
    # a URI (s3a://, abfss://, gs://, hdfs://) holds the spool and Spark's checkpoint there
    checkpoint = _resolve_path(top.string("checkpoint"), base_dir)
    ha = None
    if ha_raw := top.section("ha", required=False):
        ha = HaConfig(
            zookeeper=ha_raw.string("zookeeper"),
            session_timeout_s=ha_raw.seconds("session_timeout_s", 10.0, minimum=1, maximum=600),
        )
        ha_raw.done()
    spark = SparkConfig()
    if spark_raw := top.section("spark", required=False):
        conf = spark_raw.get("conf", dict, {})
        spark = SparkConfig(
            master=spark_raw.string("master", "local[*]"),
            conf={str(k): str(v) for k, v in conf.items()},
        )
        spark_raw.done()
    top.done()
    return Config(name, source, metadata_url, settings, delta, kafka, checkpoint, ha, spark)


def _source(sec: _Section | None, name: str) -> SourceConfig:
    assert sec is not None
    kind = sec.choice("type", SOURCE_TYPES)
    facts = KINDS[kind]
    url = sec.string("url", hint="add source.url (a URL, or an Airflow connection id)")
    if "://" in url:
        scheme = url.split("://", 1)[0].split("+", 1)[0]
        expected = facts.url_schemes
        if scheme not in expected:
            raise ConfigError(
                f"source.url scheme {scheme!r} does not match source.type {kind}",
                f"use {expected[0]}://user:password@host:port/db",
            )
    tables_raw = sec.get("tables", list, hint="list the tables to capture as db.table")
    if not tables_raw:
        raise ConfigError("source.tables is empty", "list at least one table as db.table")
    tables = []
    for i, item in enumerate(tables_raw):
        if not isinstance(item, str):
            raise ConfigError(f"source.tables[{i}] must be a string like db.table, got {item!r}")
        try:
            tables.append(TableId.parse(item))
        except ValueError as err:
            raise ConfigError(f"source.tables[{i}]: {err}") from None
    if len(set(tables)) != len(tables):
        raise ConfigError("source.tables lists a table twice", "list each table once")
    watermark = sec.choice("watermark", WATERMARKS, "table")
    if watermark not in facts.watermark_modes:
        offering = " or ".join(k.product for k in kinds_offering(watermark))
        raise ConfigError(
            f"source.watermark {watermark} needs a {offering} source",
            f"use {' or '.join(facts.watermark_modes)} for {facts.product}",
        )
    slot = sec.string("slot", None)
    if slot is not None and (not facts.takes_slot or not re.fullmatch(r"[a-z0-9_]{1,63}", slot)):
        with_slots = [k for k in KINDS.values() if k.takes_slot]
        raise ConfigError(
            f"source.slot must be a {' or '.join(k.product for k in with_slots)} slot name"
            " (lower-case letters, digits, _)",
            f"only {' or '.join(k.name for k in with_slots)} sources take a slot",
        )
    server_id = sec.get("server_id", int, None)
    if server_id is not None and not 1 <= server_id < 2**32:
        raise ConfigError("source.server_id must be between 1 and 4294967295")
    sec.done()
    return SourceConfig(kind, url, tuple(tables), watermark, slot or None, server_id)


def _sinks(
    sec: _Section | None, base_dir: Path
) -> tuple[DeltaSinkConfig | None, KafkaSinkConfig | None]:
    assert sec is not None
    delta = kafka = None
    if d := sec.section("delta", required=False):
        delta = DeltaSinkConfig(
            path=_resolve_path(d.string("path"), base_dir),
            tombstone_retention_hours=d.integer("tombstone_retention_hours", 168, minimum=0),
            deletion_vectors=d.get("deletion_vectors", bool, True),
            batch_wait_s=d.seconds("batch_wait_s", 5.0, minimum=0, maximum=3600),
            warm_up=d.get("warm_up", bool, True),
        )
        d.done()
    if k := sec.section("kafka", required=False):
        kafka = KafkaSinkConfig(
            bootstrap_servers=k.string("bootstrap_servers"),
            topic_prefix=k.string("topic_prefix"),
            image_mode=k.choice("image_mode", IMAGE_MODES, "NEW_AND_OLD_IMAGES"),
            signal_topic=k.string("signal_topic", None),
            partitions=k.integer("partitions", 1, minimum=1, maximum=10_000),
        )
        k.done()
    sec.done()
    if delta is None and kafka is None:
        raise ConfigError("sinks has neither delta nor kafka", "configure at least one sink")
    return delta, kafka


_URI = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*)://")


def _resolve_path(value: str, base_dir: Path) -> str:
    """A URI (``s3a://``, ``abfss://``, ``gs://``, ``hdfs://``) stays as written, for Spark's
    filesystem layer; ``file://`` and plain paths become absolute local paths, relative ones to
    the config file."""
    uri = _URI.match(value)
    if uri and uri.group(1).lower() != "file":
        return value
    path = Path(value[len("file://") :] if uri else value).expanduser()
    return str(path if path.is_absolute() else (base_dir / path).resolve())


def _resolve_url(url: str, base_dir: Path) -> str:
    """Relative SQLite paths are relative to the config file, like every other path in it."""
    prefix = "sqlite:///"
    if url.startswith(prefix) and not url.startswith("sqlite:////") and url != "sqlite:///:memory:":
        return prefix + str(_resolve_path(url[len(prefix) :], base_dir))
    return url
