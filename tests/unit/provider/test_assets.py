"""Assets a finished dump announces, and its OpenLineage datasets (no services needed).

test_browser_e2e.py shows the same on a real Airflow: the backfill's Asset event starts the
downstream example DAG.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from airflow_dblog.config import load_config
from airflow_dblog.core.events import TableId
from airflow_dblog.engine.metadata import MetadataStore
from airflow_dblog.engine.metadata.dumps import TablePlan
from airflow_dblog.provider.assets import (
    dblog_assets,
    kafka_uri,
    openlineage_name,
    openlineage_names,
    refreshed,
    storage_uri,
)
from airflow_dblog.provider.sensors.dblog import DblogDumpSensor

SOURCE_URL = "mysql://dblog:Secret-pw@db.example:3307/app"


@pytest.fixture
def config_file(tmp_path: Path) -> Path:
    file = tmp_path / "dblog.yaml"
    file.write_text(
        f"""
name: inventory
source: {{type: mysql, url: "{SOURCE_URL}", tables: [app.orders, app.users]}}
metadata: {{url: "sqlite:///{tmp_path}/meta.db"}}
sinks:
  delta: {{path: ./out/delta}}
  kafka: {{bootstrap_servers: "k1:9092,k2:9092", topic_prefix: inv}}
checkpoint: ./cp
"""
    )
    return file


@pytest.mark.parametrize(
    ("location", "uri", "lineage"),
    [
        (
            "/data/delta/app/orders",
            "file:///data/delta/app/orders",
            ("file", "/data/delta/app/orders"),
        ),
        (
            "s3a://lake/delta/app/orders",
            "s3://lake/delta/app/orders",
            ("s3://lake", "delta/app/orders"),
        ),
        ("gs://lake/d/app/orders", "gs://lake/d/app/orders", ("gs://lake", "d/app/orders")),
        (
            "abfss://c@acct.dfs.core.windows.net/d/app/orders",
            "abfss://c@acct.dfs.core.windows.net/d/app/orders",
            ("abfss://c@acct.dfs.core.windows.net", "d/app/orders"),
        ),
        (
            "hdfs://nn:8020/d/app/orders",
            "hdfs://nn:8020/d/app/orders",
            ("hdfs://nn:8020", "/d/app/orders"),
        ),
        (
            "/data/my delta/app/orders",
            "file:///data/my%20delta/app/orders",
            ("file", "/data/my delta/app/orders"),
        ),
    ],
)
def test_delta_locations_as_asset_uris_airflow_accepts(
    location: str, uri: str, lineage: tuple[str, str]
) -> None:
    from airflow_dblog.provider.compat import Asset

    assert storage_uri(location) == uri
    asset = Asset(uri)
    assert (asset.uri, asset.name) == (uri, uri)  # unchanged by Airflow's URI normalisation
    assert openlineage_name(uri) == lineage


def test_one_asset_per_delta_table_and_topic(config_file: Path, tmp_path: Path) -> None:
    config = load_config(config_file)
    places = refreshed(config, ["app.users"])
    assert [(p.sink, str(p.table), p.uri) for p in places] == [
        ("delta", "app.users", f"file://{tmp_path}/out/delta/app/users"),
        ("kafka", "app.users", "kafka://k1:9092/inv.app.users"),
    ]
    assert len(refreshed(config)) == 4 and refreshed(config, []) == []
    assert [a.uri for a in dblog_assets(config, sinks=("delta",))] == [
        f"file://{tmp_path}/out/delta/app/orders",
        f"file://{tmp_path}/out/delta/app/users",
    ]
    assert kafka_uri("SASL_SSL://b1:9093, b2:9093", "t") == "kafka://b1:9093/t"


def test_openlineage_names_follow_the_naming_spec(config_file: Path, tmp_path: Path) -> None:
    config = load_config(config_file)
    inputs, outputs = openlineage_names(config, [TableId("app", "orders")], SOURCE_URL)
    assert inputs == [("mysql://db.example:3307", "app.orders")]
    assert outputs == [
        ("file", f"{tmp_path}/out/delta/app/orders"),
        ("kafka://k1:9092", "inv.app.orders"),
    ]
    pg = "postgresql://u:pw@pg.example/shop"
    from airflow_dblog.provider.assets import source_openlineage_name

    assert source_openlineage_name("postgres", pg, TableId("public", "orders")) == (
        "postgres://pg.example:5432",
        "shop.public.orders",
    )


def _done_dump(config_file: Path) -> int:
    """A dump of both tables whose chunks the "stream" completed: 3 + 2 rows emitted."""
    store = MetadataStore(load_config(config_file).metadata_url)
    plans = [
        TablePlan("app.orders", ["id"], 3, key_chunks=[[[1], [2], [3]]]),
        TablePlan("app.users", ["id"], 2, key_chunks=[[[1], [2]]]),
    ]
    dump_id = store.create_dump("inventory", "keys", plans)
    while (chunk := store.claim_pending_chunk(dump_id, "w")) is not None:
        n = len(chunk.keys or [])
        store.complete_chunk(chunk.id, n, 0, n)
    assert store.progress(dump_id).state == "done"
    store.engine.dispose()
    return dump_id


@pytest.mark.parametrize("deferrable", [True, False])
def test_sensor_announces_each_refreshed_place_through_the_alias(
    config_file: Path, tmp_path: Path, deferrable: bool
) -> None:
    from airflow.sdk.execution_time.context import OutletEventAccessors

    from airflow_dblog.provider.compat import AssetAlias

    dump_id = _done_dump(config_file)
    sensor = DblogDumpSensor(
        task_id="w", dump_id=dump_id, config_path=str(config_file), deferrable=deferrable
    )
    assert sensor.outlets == [AssetAlias("dblog")]
    events = OutletEventAccessors()
    context = {"outlet_events": events}
    if deferrable:
        done = {"status": "done", "dump_id": dump_id, "chunks_done": 2, "chunks_total": 2}
        rows = sensor.execute_complete(context, {**done, "rows_emitted": 5, "rows_dropped": 0})
    else:
        rows = sensor.execute(context)
    assert rows == 5
    emitted = [
        (e.dest_asset_key.uri, e.extra["table"], e.extra["sink"], e.extra["rows_emitted"])
        for e in events[AssetAlias("dblog")].asset_alias_events
    ]
    delta = f"file://{tmp_path}/out/delta/app"
    assert emitted == [
        (f"{delta}/orders", "app.orders", "delta", 3),
        ("kafka://k1:9092/inv.app.orders", "app.orders", "kafka", 3),
        (f"{delta}/users", "app.users", "delta", 2),
        ("kafka://k1:9092/inv.app.users", "app.users", "kafka", 2),
    ]
    assert {e.extra["dump_id"] for e in events[AssetAlias("dblog")].asset_alias_events} == {dump_id}


def test_no_alias_no_outlets(config_file: Path) -> None:
    sensor = DblogDumpSensor(task_id="w", dump_id=1, config_path=str(config_file), asset_alias=None)
    assert sensor.outlets == []


def test_without_openlineage_no_lineage_and_no_error(config_file: Path) -> None:
    """In a process where the OpenLineage provider's classes cannot be imported (as when it
    is not installed; its package metadata stays, so Airflow's provider discovery still runs)."""
    dump_id = _done_dump(config_file)
    script = f"""
import sys
absent = (
    "openlineage",
    "airflow.providers.openlineage.extractors",
    "airflow.providers.common.compat.openlineage",
)
class Absent:
    def find_spec(self, name, path=None, target=None):
        if name.startswith(absent):
            raise ModuleNotFoundError(f"No module named {{name!r}}")
sys.meta_path.insert(0, Absent())
from airflow_dblog.provider.sensors.dblog import DblogDumpSensor
sensor = DblogDumpSensor(
    task_id="w", dump_id={dump_id}, config_path={str(config_file)!r}, deferrable=False
)
assert sensor.execute({{}}) == 5  # the dump's tables are known, lineage is all that is missing
assert sensor.get_openlineage_facets_on_complete(None) is None
print("ok")
"""
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip().splitlines()[-1] == "ok"


def test_with_openlineage_inputs_and_outputs(config_file: Path, tmp_path: Path) -> None:
    """Through the provider's own extractor manager, as its listener calls it on success."""
    from types import SimpleNamespace

    from airflow.providers.common.compat.openlineage.facet import Dataset
    from airflow.providers.openlineage.extractors.manager import ExtractorManager
    from airflow.utils.state import TaskInstanceState

    sensor = DblogDumpSensor(
        task_id="w", dump_id=_done_dump(config_file), config_path=str(config_file), deferrable=False
    )
    assert sensor.get_openlineage_facets_on_complete(None) is None  # before the dump is done
    sensor.execute({})
    lineage = ExtractorManager().extract_metadata(
        SimpleNamespace(run_id="r"), sensor, TaskInstanceState.SUCCESS, None
    )
    assert lineage.inputs == [
        Dataset(namespace="mysql://db.example:3307", name="app.orders"),
        Dataset(namespace="mysql://db.example:3307", name="app.users"),
    ]
    delta = f"{tmp_path}/out/delta/app"
    assert lineage.outputs == [
        Dataset(namespace="file", name=f"{delta}/orders"),
        Dataset(namespace="kafka://k1:9092", name="inv.app.orders"),
        Dataset(namespace="file", name=f"{delta}/users"),
        Dataset(namespace="kafka://k1:9092", name="inv.app.users"),
    ]
