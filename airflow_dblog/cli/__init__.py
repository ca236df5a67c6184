"""The ``dblog`` command line: the same operations as the Airflow operators, for people and scripts.

Every failure prints one line ``dblog: error: ...`` naming the problem and the fix, and exits 2
(bad input) or 1 (anything else); nothing is written before the input has been validated.
The commands that reach the source database resolve an Airflow connection id in ``source.url``
here, once (:func:`~airflow_dblog.provider.connections.resolved`); the layers below see a URL.
:mod:`~airflow_dblog.cli.spark_submit` is the same ``stream`` command for ``spark-submit``.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from collections.abc import Sequence

from airflow_dblog.config import Config, load_config
from airflow_dblog.core.events import TableId
from airflow_dblog.core.keys import parse_keys
from airflow_dblog.engine.metadata import MetadataStore
from airflow_dblog.errors import ConfigError, DblogError, InputError
from airflow_dblog.provider.connections import resolved
from airflow_dblog.redact import redact


def _config_arg(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "-c", "--config", required=True, metavar="FILE", help="stream config (YAML)"
    )


def _dump_id_arg(parser: argparse.ArgumentParser, required: bool = True) -> None:
    parser.add_argument("--dump", type=int, required=required, metavar="ID", help="dump id")


def _what_args(parser: argparse.ArgumentParser, verb: str) -> None:
    _config_arg(parser)
    what = parser.add_mutually_exclusive_group(required=True)
    what.add_argument(
        "--table", action="append", metavar="DB.TABLE", help=f"table to {verb} (repeatable)"
    )
    what.add_argument("--all", action="store_true", help=f"{verb} every table in source.tables")
    parser.add_argument(
        "--pk",
        action="append",
        metavar="KEY",
        help=f'a primary key to {verb}, as the Airflow form takes it: 42, abc, [1, "x"] or'
        ' {"id": 1} (repeatable; needs --table)',
    )
    parser.add_argument("--requested-by", default="cli", help="who asked (stored with the dump)")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="dblog",
        description="DBLog-style change data capture: stream the binlog/WAL and dump tables "
        "in watermark-bounded chunks into Delta Lake and Kafka.",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p = sub.add_parser("stream", help="run the long-lived streaming job for one source")
    _config_arg(p)
    p.set_defaults(handler=_stream)

    p = sub.add_parser(
        "dump",
        help="request a dump of all tables, one table, or specific primary keys",
        description="Plan a dump; the running stream executes it. Prints the dump id last.",
    )
    _what_args(p, "dump")
    p.set_defaults(handler=_dump, verify=None)

    p = sub.add_parser(
        "verify",
        help="compare the Delta tables with the source, live, and repair what differs",
        description="Plan a verify dump: the running stream reads the same chunks as a dump and"
        " compares each with Delta (rows checked, missing in the lake, extra in the lake,"
        " different). By default the differences are then read again and written (Delta gets"
        " only them, Kafka each repair); --dry-run reports only. Follow it with"
        " dblog status --dump ID. Prints the dump id last.",
    )
    _what_args(p, "verify")
    p.add_argument(
        "--dry-run",
        dest="verify",
        action="store_const",
        const="dry-run",
        default="repair",
        help="write nothing; report the counts and example keys only",
    )
    p.set_defaults(handler=_dump)

    p = sub.add_parser(
        "status",
        help="show the stream's state and lag, and dumps and their progress",
        description="Without --dump: the stream (state, leader, bytes and seconds behind its"
        " source) and every dump; --json prints {stream: {...}, dumps: [...]}. With --dump: that"
        " dump only (--json: one object).",
    )
    _config_arg(p)
    _dump_id_arg(p, required=False)
    p.add_argument("--json", action="store_true", help="print JSON (state, chunks_total, ...)")
    p.set_defaults(handler=_status)

    for action, text in (
        ("pause", "stop handing out new chunks of a dump"),
        ("resume", "continue a paused dump"),
        ("cancel", "cancel a dump; chunks not yet emitted are dropped"),
    ):
        p = sub.add_parser(action, help=text)
        _config_arg(p)
        _dump_id_arg(p)
        p.set_defaults(handler=_control, action=action)

    p = sub.add_parser("set", help="change chunk size, delay or parallelism of the running stream")
    _config_arg(p)
    p.add_argument("--chunk-size", type=int, metavar="N")
    p.add_argument("--delay-ms", type=int, metavar="N")
    p.add_argument("--parallelism", type=int, metavar="N")
    p.set_defaults(handler=_set)

    p = sub.add_parser(
        "optimize",
        help="compact the Delta tables and sort their files by key (safe while streaming)",
    )
    _config_arg(p)
    p.add_argument(
        "--table", action="append", metavar="DB.TABLE", help="only this table (repeatable)"
    )
    p.set_defaults(handler=_optimize)

    p = sub.add_parser("db", help="manage the metadata database")
    db_sub = p.add_subparsers(dest="db_command", required=True, metavar="ACTION")
    up = db_sub.add_parser("upgrade", help="apply metadata migrations (also done on first use)")
    _config_arg(up)
    up.set_defaults(handler=_db_upgrade)
    return parser


def _load(args: argparse.Namespace) -> tuple[Config, MetadataStore]:
    config = load_config(args.config)
    return config, MetadataStore(config.metadata_url)


def _stream(args: argparse.Namespace) -> int:
    config = resolved(load_config(args.config))
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    logging.getLogger("py4j").setLevel(logging.WARNING)
    from airflow_dblog.spark.stream_job import run_stream  # imports pyspark: only when streaming

    return run_stream(config)


def _dump(args: argparse.Namespace) -> int:
    config = load_config(args.config)
    if args.pk and (not args.table or len(args.table) != 1):
        raise InputError("--pk needs exactly one --table", "name the table the keys belong to")
    from airflow_dblog.engine.planner import plan_dump  # talks to the source database

    store = MetadataStore(config.metadata_url)
    keys = [key for text in args.pk or [] for key in parse_keys(text)]
    dump_id = plan_dump(
        resolved(config),
        store,
        tables=None if args.all else args.table,
        keys=keys or None,
        requested_by=args.requested_by,
        verify=args.verify,
    )
    progress = store.progress(dump_id)
    what = "dump" if args.verify is None else f"verify ({args.verify})"
    print(
        f"planned {what} {dump_id} of {', '.join(progress.tables)}: {progress.chunks_total} chunks"
    )
    print(dump_id)
    return 0


def _status(args: argparse.Namespace) -> int:
    config, store = _load(args)
    dumps = [store.dump(args.dump)] if args.dump else store.dumps(config.name)
    progress = [store.progress(d.id) for d in dumps]
    stream = None
    if not args.dump:  # the stream's lag asks the source: only when it is asked for
        from airflow_dblog.engine.lag import stream_status

        stream = stream_status(resolved(config), store)
    if args.json:
        if args.dump:
            print(json.dumps(progress[0].as_dict(), indent=2))
        else:
            assert stream is not None
            dicts = [p.as_dict() for p in progress]
            print(json.dumps({"stream": stream.as_dict(), "dumps": dicts}, indent=2))
        return 0
    if stream is not None:
        print(stream.line())
    if not progress:
        print(f"no dumps for stream {config.name}")
    for p in progress:
        line = (
            f"dump {p.dump_id} [{p.state}] {', '.join(p.tables)}: "
            f"{p.chunks_done}/{p.chunks_total} chunks ({p.percent:.1f}%), "
            f"{p.rows_emitted} rows emitted, {p.rows_dropped} dropped as conflicting"
        )
        print(line + (f" - {p.reason}" if p.reason else ""))
        if p.verify is not None:
            print(f"  {p.verify.line()}")
            if examples := p.verify.examples_line():
                print(f"  examples: {examples}")
    return 0


def _control(args: argparse.Namespace) -> int:
    _, store = _load(args)
    dump = store.apply(args.dump, args.action)
    print(f"dump {dump.id} is now {dump.state}")
    return 0


def _set(args: argparse.Namespace) -> int:
    if args.chunk_size is None and args.delay_ms is None and args.parallelism is None:
        raise InputError("nothing to set", "pass --chunk-size, --delay-ms or --parallelism")
    config, store = _load(args)
    store.set_controls(config.name, args.chunk_size, args.delay_ms, args.parallelism)
    settings = store.controls(config.name, config.dump)
    print(
        f"stream {config.name}: chunk_size={settings.chunk_size} delay_ms={settings.delay_ms} "
        f"parallelism={settings.parallelism}"
    )
    return 0


def _optimize(args: argparse.Namespace) -> int:
    config = load_config(args.config)
    if config.delta is None:
        raise InputError(f"{args.config} has no sinks.delta", "add one, or nothing to optimize")
    named = args.table or [str(t) for t in config.source.tables]
    unknown = [t for t in named if t not in {str(t) for t in config.source.tables}]
    if unknown:
        raise InputError(
            f"--table {', '.join(unknown)} is not in source.tables",
            "name tables the stream captures, as db.table",
        )
    tables = [TableId.parse(t) for t in named]
    from delta.tables import DeltaTable  # imports pyspark: only when optimizing

    from airflow_dblog.engine.configured_source import open_source
    from airflow_dblog.sinks.delta_sink import optimize, table_path
    from airflow_dblog.spark.session import build_spark_session

    config = resolved(config)
    source = open_source(config)
    try:
        keys = {table: source.describe(table).key[0] for table in tables}
    finally:
        source.close()
    spark = build_spark_session(
        f"dblog-optimize-{config.name}",
        config.spark.master,
        extra_conf=config.spark.conf,
        paths=(config.delta.path,),
    )
    try:
        for table in tables:
            path = table_path(config.delta, table)
            if not DeltaTable.isDeltaTable(spark, path):
                print(f"{table}: no Delta table at {path} yet")
                continue
            done = optimize(spark, path, keys[table])
            print(
                f"{table}: {done['files_removed']} files compacted into {done['files_added']},"
                f" sorted by {keys[table]}"
            )
    finally:
        spark.stop()
    return 0


def _db_upgrade(args: argparse.Namespace) -> int:
    _, store = _load(args)
    print(f"metadata database {redact(store.url)} is at revision {store.revision()}")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return args.handler(args)
    except DblogError as err:
        print(f"dblog: error: {redact(str(err))}", file=sys.stderr)
        return 2 if isinstance(err, (ConfigError, InputError)) else 1
    except KeyboardInterrupt:
        return 130
