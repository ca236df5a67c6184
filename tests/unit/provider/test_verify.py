"""Verify dumps from Airflow: the operator plans them, the sensor judges them against
``max_differences`` and waits for their repairs, against a SQLite metadata store.

The stream's part is played here: chunk verdicts written with ``record_verdict``, the repair
requested with ``request_repair`` (before the chunk completes, as the stream does), chunks
completed with ``complete_chunk``.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from airflow_dblog.config import load_config
from airflow_dblog.core.verify import ChunkVerdict
from airflow_dblog.engine.metadata import MetadataStore
from airflow_dblog.engine.metadata.dumps import TablePlan
from airflow_dblog.engine.repairs import DIFFERENCES
from airflow_dblog.errors import InputError
from airflow_dblog.provider.hooks.dblog import DblogHook
from airflow_dblog.provider.operators.dblog import DblogBackfillOperator, DblogDumpOperator
from airflow_dblog.provider.sensors.dblog import DblogDumpSensor, DumpFailed
from airflow_dblog.provider.triggers.dblog import DblogDumpTrigger
from airflow_dblog.provider.verify import LakeDiffers, RepairsProgress
from tests.support.fake_source import FakeDatabase, fake_config, registered_fake_kind
from tests.support.trigger_loop import collect

COUNTS = "verify (repair): 5 rows checked, 1 missing in the lake, 0 extra, 1 different, 2 repaired"


@pytest.fixture
def config_file(tmp_path: Path) -> Path:
    file = tmp_path / "dblog.yaml"
    file.write_text(
        f"""
name: inventory
source: {{type: mysql, url: "mysql://u:p@127.0.0.1:1/app", tables: [app.orders, app.users]}}
metadata: {{url: "sqlite:///{tmp_path}/meta.db"}}
sinks:
  delta: {{path: ./out/delta}}
  kafka: {{bootstrap_servers: "k1:9092", topic_prefix: inv}}
checkpoint: ./cp
"""
    )
    return file


@pytest.fixture
def store(config_file: Path) -> Iterator[MetadataStore]:
    store = MetadataStore(load_config(config_file).metadata_url)
    yield store
    store.engine.dispose()


def _verified_dump(store: MetadataStore, mode: str) -> int:
    """A verify dump of both tables as the stream leaves it: done, app.orders' chunk found key 2
    missing and key 3 different (in repair mode, a follow-up dump of both keys requested)."""
    plans = [
        TablePlan("app.orders", ["id"], 3, key_chunks=[[[1], [2], [3]]]),
        TablePlan("app.users", ["id"], 2, key_chunks=[[[1], [2]]]),
    ]
    dump_id = store.create_dump("inventory", "keys", plans, verify=mode)
    while (chunk := store.claim_pending_chunk(dump_id, "w")) is not None:
        n = len(chunk.keys or [])
        if chunk.table_name == "app.orders":
            repair = mode == "repair"
            if repair:
                store.request_repair(
                    "app.orders", ["id"], dump_id, {chunk.id: [[2], [3]]}, reason=DIFFERENCES
                )
            examples = (("missing", (2,)), ("different", (3,)))
            verdict = ChunkVerdict(n, missing=1, different=1, repaired=2 if repair else 0)
            store.record_verdict(chunk.id, dataclasses.replace(verdict, examples=examples))
        else:
            store.record_verdict(chunk.id, ChunkVerdict(n))
        store.complete_chunk(chunk.id, n, 0, 0)
    assert store.progress(dump_id).state == "done"
    return dump_id


def _finish(store: MetadataStore, dump_id: int) -> None:
    """The stream runs dump ``dump_id``'s chunks: every key read again and written."""
    while (chunk := store.claim_pending_chunk(dump_id, "w")) is not None:
        n = len(chunk.keys or [])
        store.complete_chunk(chunk.id, n, 0, n)


def _sensor(config_file: Path, dump_id: int, **kwargs: Any) -> DblogDumpSensor:
    return DblogDumpSensor(task_id="wait", dump_id=dump_id, config_path=str(config_file), **kwargs)


def _done_event(dump_id: int) -> dict[str, Any]:
    counts = {"chunks_done": 2, "chunks_total": 2, "rows_emitted": 0, "rows_dropped": 0}
    return {"status": "done", "reason": None, "dump_id": dump_id, **counts}


def _alias_events(events: Any) -> list[tuple[str, dict[str, Any]]]:
    from airflow_dblog.provider.compat import AssetAlias

    return [(e.dest_asset_key.uri, e.extra) for e in events[AssetAlias("dblog")].asset_alias_events]


# -- the operators ------------------------------------------------------------------------------


def test_the_dump_operator_plans_a_verify_dump_in_repair_or_dry_run_mode(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    with registered_fake_kind():
        db = FakeDatabase()
        orders = db.create_table("orders", {"id": "int"})
        db.insert(orders, {"id": 1}, {"id": 2})
        config = fake_config(db, [orders], tmp_path)
        monkeypatch.setattr(DblogHook, "config", property(lambda self: config))
        planned = [
            DblogDumpOperator(task_id="plan", **options).execute({})
            for options in (
                {"verify": True},
                {"verify": True, "dry_run": "True"},  # a rendered template is text
                {},
            )
        ]
        keys = DblogBackfillOperator(
            task_id="keys", table="db.orders", keys="1\n2", verify="true", dry_run=True
        ).execute({})
        db.drop()
    store = MetadataStore(config.metadata_url)
    assert [store.dump(i).verify for i in planned] == ["repair", "dry-run", None]
    assert (store.dump(keys).verify, store.dump(keys).kind) == ("dry-run", "keys")
    out = capsys.readouterr().out
    assert f"planned verify (repair) dump {planned[0]} of all tables" in out
    assert f"planned verify (dry-run) dump {keys}: 2 keys of db.orders" in out
    store.engine.dispose()


def test_dry_run_without_verify_is_refused_in_one_line(config_file: Path) -> None:
    with pytest.raises(InputError) as parsed:
        DblogDumpOperator(task_id="plan", config_path=str(config_file), dry_run=True)
    assert str(parsed.value) == (
        "dry_run=True without verify=True: an ordinary dump writes, it has no dry run;"
        " set verify=True to compare the lake with the source without writing"
    )
    templated = DblogDumpOperator(task_id="plan", config_path=str(config_file), dry_run="{{ x }}")
    templated.dry_run = "True"  # as rendered: refused before anything is planned
    with pytest.raises(InputError, match="set verify=True"):
        templated.execute({})
    with pytest.raises(InputError, match=r"dry_run='maybe' is neither true nor false"):
        DblogDumpOperator(task_id="p", verify=True, dry_run="maybe").execute({})


# -- the sensor ---------------------------------------------------------------------------------


@pytest.mark.parametrize("deferrable", [True, False])
def test_the_sensor_fails_past_max_differences_with_the_counts_and_example_keys(
    config_file: Path, store: MetadataStore, deferrable: bool
) -> None:
    dump_id = _verified_dump(store, "repair")
    (repair,) = store.dumps("inventory")[1:]
    sensor = _sensor(config_file, dump_id, max_differences="1", deferrable=deferrable)
    with pytest.raises(LakeDiffers) as failed:
        if deferrable:
            sensor.execute_complete({}, _done_event(dump_id))
        else:
            sensor.execute({})
    message = str(failed.value)
    assert "\n" not in message
    assert message == (
        f"verify dump {dump_id} found 2 differences, more than max_differences=1: {COUNTS};"
        " examples app.orders: missing [2], different [3]; "
        f"dumps {repair.id} write them again; look at the rows of the example keys"
        f" (dblog status -c FILE --dump {dump_id}) for what made the lake drift"
    )


def test_a_dry_run_past_max_differences_says_how_to_repair(
    config_file: Path, store: MetadataStore
) -> None:
    dump_id = _verified_dump(store, "dry-run")
    assert store.dumps("inventory")[1:] == []  # a dry run asks for no repair
    with pytest.raises(LakeDiffers, match=r"then repair them: verify again without dry_run$"):
        _sensor(config_file, dump_id, max_differences=0, deferrable=False).execute({})
    with pytest.raises(InputError, match=r"max_differences='lots' is not a whole number; give"):
        _sensor(config_file, dump_id, max_differences="lots", deferrable=False).execute({})


def test_a_dry_run_within_the_limit_returns_its_report_and_emits_no_asset_event(
    config_file: Path, store: MetadataStore
) -> None:
    from airflow.sdk.execution_time.context import OutletEventAccessors

    dump_id = _verified_dump(store, "dry-run")
    events = OutletEventAccessors()
    result = _sensor(config_file, dump_id, max_differences=2, deferrable=False).execute(
        {"outlet_events": events}
    )
    assert result["dump_id"] == dump_id and result["repair_dumps"] == []
    assert result["rows_emitted"] == 0
    assert result["verify"] == store.progress(dump_id).verify.as_dict()  # type: ignore[union-attr]
    assert (result["verify"]["mode"], result["verify"]["missing"]) == ("dry-run", 1)
    assert _alias_events(events) == []


def test_the_classic_sensor_waits_for_the_repair_then_announces_what_it_wrote(
    config_file: Path, store: MetadataStore, tmp_path: Path
) -> None:
    from airflow.sdk.execution_time.context import OutletEventAccessors

    dump_id = _verified_dump(store, "repair")
    (repair,) = store.dumps("inventory")[1:]
    sensor = _sensor(config_file, dump_id, max_differences=2, deferrable=False)
    assert sensor.poke({}) is False  # the verify dump is done, its repair is not
    _finish(store, repair.id)
    events = OutletEventAccessors()
    result = sensor.execute({"outlet_events": events})
    assert (result["rows_emitted"], result["repair_dumps"]) == (2, [repair.id])
    assert result["verify"]["different"] == 1
    delta = f"file://{tmp_path}/out/delta/app/orders"
    announced = [
        (uri, extra["table"], extra["rows_emitted"]) for uri, extra in _alias_events(events)
    ]
    assert announced == [
        (delta, "app.orders", 2),
        ("kafka://k1:9092/inv.app.orders", "app.orders", 2),
    ]  # app.users agreed with its source: nothing was written to it
    (_, extra), _ = _alias_events(events)
    assert (extra["dump_id"], extra["verify"], extra["repair_dumps"]) == (
        dump_id,
        "repair",
        [repair.id],
    )


def test_the_deferrable_sensor_defers_again_for_the_repair(
    config_file: Path, store: MetadataStore
) -> None:
    from airflow.sdk.exceptions import TaskDeferred
    from airflow.sdk.execution_time.context import OutletEventAccessors

    dump_id = _verified_dump(store, "repair")
    (repair,) = store.dumps("inventory")[1:]
    sensor = _sensor(config_file, dump_id, poke_interval=0.02)
    with pytest.raises(TaskDeferred) as deferred:
        sensor.execute_complete({}, _done_event(dump_id))
    assert deferred.value.method_name == "execute_repairs_complete"
    trigger = deferred.value.trigger
    assert isinstance(trigger, DblogDumpTrigger) and trigger.repairs == [repair.id]
    _finish(store, repair.id)
    (event,), _ = asyncio.run(collect(trigger))
    assert (event["status"], event["dump_id"], event["rows_emitted"]) == ("done", dump_id, 2)
    events = OutletEventAccessors()
    result = sensor.execute_repairs_complete({"outlet_events": events}, event)
    assert result["repair_dumps"] == [repair.id] and len(_alias_events(events)) == 2


def test_an_ordinary_dump_ignores_max_differences_and_returns_its_rows(
    config_file: Path, store: MetadataStore
) -> None:
    dump_id = store.create_dump("inventory", "keys", [TablePlan("app.users", ["id"], 1, [[[1]]])])
    _finish(store, dump_id)
    assert _sensor(config_file, dump_id, max_differences=0, deferrable=False).execute({}) == 1


def test_a_cancelled_repair_fails_the_sensor(config_file: Path, store: MetadataStore) -> None:
    dump_id = _verified_dump(store, "repair")
    (repair,) = store.dumps("inventory")[1:]
    store.apply(repair.id, "cancel", reason="operator said so")
    with pytest.raises(DumpFailed) as failed:
        _sensor(config_file, dump_id, deferrable=False).execute({})
    assert str(failed.value) == (
        f"verify dump {dump_id} is done, but a repair did not finish (cancelled): dump"
        f" {repair.id} cancelled: operator said so; see dblog status -c FILE, then verify again"
    )


def test_the_repairs_are_one_dump_to_wait_on(config_file: Path, store: MetadataStore) -> None:
    """A failed or cancelled repair decides at once; else the least advanced state decides."""
    progress = [store.progress(_verified_dump(store, "dry-run")) for _ in range(3)]
    states = [
        dataclasses.replace(p, state=s)
        for p, s in zip(progress, ["done", "paused", "running"], strict=True)
    ]
    assert RepairsProgress(1, tuple(states)).state == "running"
    assert RepairsProgress(1, tuple(states[:2])).state == "paused"
    assert RepairsProgress(1, tuple(states[:1])).state == "done"
    assert RepairsProgress(1, ()).state == "done"
    failed = dataclasses.replace(progress[0], state="failed", reason="boom")
    both = RepairsProgress(1, (*states, failed))
    assert (both.state, both.reason) == ("failed", f"dump {failed.dump_id} failed: boom")
    assert both.line().startswith("repairs of dump 1: 1/4 dumps done, rows emitted 0; dump ")


def test_the_trigger_serializes_the_repairs_it_follows() -> None:
    trigger = DblogDumpTrigger("sqlite:///x.db", 7, repairs=[8, 9])
    path, kwargs = trigger.serialize()
    assert kwargs["repairs"] == [8, 9]
    assert DblogDumpTrigger(**kwargs).serialize() == (path, kwargs)
