"""Hypothesis fuzz of everything a person or a message can type: config, CLI, form keys, signals.

The contract (design: "Bad input"): either the input is accepted, or it fails with the package's
own one-line error — never a traceback from deep inside, never a half-written dump.
"""

from __future__ import annotations

import contextlib
import io
import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from airflow_dblog.cli import main as dblog
from airflow_dblog.config import Config, parse_config
from airflow_dblog.core.keys import parse_keys
from airflow_dblog.engine.metadata import MetadataStore
from airflow_dblog.engine.signals import Signal, SignalError, parse_signal
from airflow_dblog.errors import DblogError

# what people paste: quotes, semicolons, SQL, unicode, control characters, huge numbers
NASTY = st.sampled_from(
    [
        "app.orders",
        "app.'orders",
        'app."; DROP TABLE x; --',
        "app.ordërs_ünï",
        "app.`a`.`b`",
        "app.",
        ".orders",
        "${UNSET}",
        "${DB_PASSWORD:-}",
        "\x00",
        "a" * 300,
        "-1",
        "1e400",
        "",
    ]
)
SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=True),
    st.text(max_size=30),
    NASTY,
)
JSONISH = st.recursive(
    SCALARS,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=10), inner, max_size=4)
    ),
    max_leaves=12,
)

BASE: dict[str, Any] = {
    "name": "inventory",
    "source": {
        "type": "mysql",
        "url": "mysql://dblog:${DB_PASSWORD}@127.0.0.1:1/app",
        "tables": ["app.orders"],
        "watermark": "table",
    },
    "metadata": {"url": "sqlite:///./meta.db"},
    "dump": {"chunk_size": 100, "delay_ms": 0, "parallelism": 1},
    "sinks": {
        "delta": {"path": "./delta"},
        "kafka": {"bootstrap_servers": "127.0.0.1:9092", "topic_prefix": "inventory"},
    },
    "checkpoint": "./checkpoint",
    "ha": {"zookeeper": "127.0.0.1:2181"},
    "spark": {"master": "local[2]", "conf": {"spark.ui.enabled": False}},
}
PATHS = (
    [
        (top,) if not isinstance(value, dict) else (top, key)
        for top, value in BASE.items()
        for key in (value if isinstance(value, dict) else [None])
    ]
    + [(top,) for top in BASE]
    + [("unknown",), ("source", "unknown")]
)


def _one_line(err: BaseException) -> None:
    text = str(err)
    assert text and "\n" not in text and "Traceback" not in text, repr(text)


@st.composite
def mutated_configs(draw: st.DrawFn) -> dict[str, Any]:
    doc = yaml.safe_load(yaml.safe_dump(BASE))  # a deep copy
    for path in draw(st.lists(st.sampled_from(PATHS), min_size=1, max_size=3)):
        value = draw(JSONISH)
        node = doc
        for part in path[:-1]:
            if not isinstance(node.get(part), dict):
                node[part] = {}
            node = node[part]
        if draw(st.booleans()) and path[-1] in node:
            del node[path[-1]]
        else:
            node[path[-1]] = value
    return doc


@settings(max_examples=400, deadline=None)
@given(mutated_configs())
def test_any_config_is_accepted_or_refused_in_one_line(doc: dict[str, Any]) -> None:
    try:
        text = yaml.safe_dump(doc, allow_unicode=True)
    except yaml.YAMLError:
        return
    try:
        config = parse_config(text, Path("/tmp"), env={"DB_PASSWORD": "pw"})
    except DblogError as err:
        _one_line(err)
    else:
        assert isinstance(config, Config)
        assert config.dump.chunk_size >= 1 and config.dump.parallelism >= 1


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=200))
def test_any_text_as_config_is_accepted_or_refused_in_one_line(text: str) -> None:
    try:
        parse_config(text, Path("/tmp"), env={})
    except DblogError as err:
        _one_line(err)


@settings(max_examples=400, deadline=None)
@given(st.one_of(st.text(max_size=200), st.lists(JSONISH.map(repr), max_size=5).map("\n".join)))
def test_form_keys_parse_or_name_the_bad_line(text: str) -> None:
    try:
        keys = parse_keys(text)
    except DblogError as err:
        _one_line(err)
        assert "line " in str(err)
    else:
        assert len(keys) == sum(1 for line in text.splitlines() if line.strip())


def _signal_docs() -> st.SearchStrategy[Any]:
    types = st.sampled_from(
        ["execute-snapshot", "stop-snapshot", "pause-snapshot", "resume-snapshot", "log", 5]
    )
    data = st.fixed_dictionaries(
        {},
        optional={
            "data-collections": st.one_of(JSONISH, st.lists(NASTY, max_size=3)),
            "type": st.one_of(st.sampled_from(["INCREMENTAL", "incremental", "BLOCKING"]), JSONISH),
        },
    )
    return st.one_of(
        JSONISH,
        st.fixed_dictionaries({"type": types}, optional={"data": st.one_of(data, JSONISH)}),
    )


@settings(max_examples=400, deadline=None)
@given(
    st.one_of(
        st.binary(max_size=100),
        _signal_docs().map(lambda d: yaml.safe_dump(d).encode()),
        _signal_docs().map(lambda d: json.dumps(d).encode()),
    )
)
def test_any_signal_message_parses_or_is_skipped_with_a_reason(value: bytes) -> None:
    try:
        signal = parse_signal(value)
    except SignalError as err:
        _one_line(err)
    else:
        assert isinstance(signal, Signal)
        assert signal.tables is None or all(isinstance(t, str) for t in signal.tables)


@pytest.fixture(scope="module")
def cli_config(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("cli-fuzz")
    file = folder / "dblog.yaml"
    doc = dict(BASE)
    doc.pop("ha")
    doc["source"] = {**BASE["source"], "url": "mysql://dblog:secret-pw@127.0.0.1:1/app"}
    file.write_text(yaml.safe_dump(doc))
    MetadataStore(f"sqlite:///{folder}/meta.db")  # migrated once, not per example
    return file


CLI_WORDS = st.sampled_from(
    [
        "status", "dump", "pause", "resume", "cancel", "set", "db", "upgrade", "--table",
        "--all", "--pk", "--dump", "--json", "--chunk-size", "--delay-ms", "--parallelism",
        "1", "0", "-5", "99999999999999999999", "x", "[1]", '{"id": 1}', "[", "app.orders",
    ]
)  # fmt: skip


@settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(st.lists(st.one_of(CLI_WORDS, NASTY), max_size=6))
def test_any_command_line_exits_with_a_code_and_at_most_one_error_line(
    cli_config: Path, words: list[str]
) -> None:
    argv = [*words[:1], "-c", str(cli_config), *words[1:]] if words else []
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = dblog(argv)
        except SystemExit as exit_:  # argparse: usage + one error line, exit 2
            code = int(exit_.code or 0)
    assert code in (0, 1, 2), code
    errors = [line for line in err.getvalue().splitlines() if "error" in line]
    assert len(errors) <= 1, err.getvalue()
    assert "Traceback" not in err.getvalue() and "secret-pw" not in out.getvalue() + err.getvalue()
