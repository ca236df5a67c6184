"""Every example DAG imports cleanly, with and without a config to read tables from."""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest

DAGS = Path(__file__).resolve().parents[3] / "dags"
CONFIG = """
name: inventory
source: {type: mysql, url: "mysql://u:p@127.0.0.1:1/app", tables: [app.orders, app.users]}
sinks: {delta: {path: ./delta}}
checkpoint: ./cp
"""


@pytest.mark.parametrize("with_config", [False, True])
def test_dags_import_without_errors_or_warnings(
    with_config: bool, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    if with_config:
        (tmp_path / "dblog.yaml").write_text(CONFIG)
        monkeypatch.setenv("DBLOG_CONFIG", str(tmp_path / "dblog.yaml"))
    else:
        monkeypatch.delenv("DBLOG_CONFIG", raising=False)
    from airflow.dag_processing.dagbag import DagBag

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        bag = DagBag(dag_folder=str(DAGS))
    assert bag.import_errors == {}
    ours = [w for w in caught if str(DAGS) in str(w.filename) or "airflow_dblog" in str(w.filename)]
    assert ours == [], [str(w.message) for w in ours]
    assert set(bag.dag_ids) == {
        "dblog_scheduled_dump",
        "dblog_backfill",
        "dblog_health",
        "dblog_on_refresh",
        "dblog_keep_alive",
        "dblog_nightly_verify",
    }
    table = bag.dags["dblog_backfill"].params.get_param("table")
    timetable = bag.dags["dblog_on_refresh"].timetable
    if with_config:
        assert table.schema["enum"] == ["app.orders", "app.users"]
        assert [a.uri for a in timetable.asset_condition.objects] == [
            f"file://{tmp_path}/delta/app/orders",
            f"file://{tmp_path}/delta/app/users",
        ]
    else:
        assert "enum" not in table.schema
        assert type(timetable).__name__ == "NullTimetable"  # no config, no Assets: manual only
    keep_alive = bag.dags["dblog_keep_alive"]
    assert [t.task_id for t in keep_alive.topological_sort()] == ["ensure_stream", "check_lag"]
    assert keep_alive.get_task("ensure_stream").mode == "local"
    for dag_id, task_id in [
        ("dblog_backfill", "wait_for_backfill"),
        ("dblog_scheduled_dump", "wait_for_dump"),
        ("dblog_nightly_verify", "wait_for_verify"),
    ]:
        outlets = bag.dags[dag_id].get_task(task_id).outlets
        assert [(type(o).__name__, o.name) for o in outlets] == [("AssetAlias", "dblog")]
    verify = bag.dags["dblog_nightly_verify"]
    assert [t.task_id for t in verify.topological_sort()] == ["plan_verify", "wait_for_verify"]
    assert verify.get_task("plan_verify").verify is True
    assert {name: verify.params[name] for name in ("dry_run", "max_differences")} == {
        "dry_run": False,  # repair mode by default
        "max_differences": 0,  # any drift fails the run
    }
    assert verify.get_task("wait_for_verify").deferrable


def test_health_dag_fails_unless_the_stream_runs_with_a_known_lag(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import importlib.util

    from airflow_dblog.core.position import Position
    from airflow_dblog.engine.metadata import MetadataStore
    from airflow_dblog.engine.metadata.database import utcnow
    from airflow_dblog.errors import DblogError

    (tmp_path / "dblog.yaml").write_text(CONFIG + "metadata: {url: sqlite:///./meta.db}\n")
    monkeypatch.setenv("DBLOG_CONFIG", str(tmp_path / "dblog.yaml"))
    spec = importlib.util.spec_from_file_location("dblog_health_dag", DAGS / "dblog_health.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    check = module.check_stream.function
    with pytest.raises(DblogError, match=r"stream inventory is unknown \(the stream never ran\)"):
        check()
    MetadataStore(f"sqlite:///{tmp_path}/meta.db").save_stream_state(
        "inventory", position=str(Position.mysql(1, 4)), heartbeat_at=utcnow()
    )
    # running, but the source (port 1) does not answer: the lag is unknown, which fails too
    with pytest.raises(
        DblogError, match=r"lag unknown \(source: cannot reach MySQL at 127\.0\.0\.1:1"
    ):
        check()
