"""The whole story as people run it: Airflow keeps the stream running, the trigger form backfills.

Everything is real: Airflow's API server, scheduler, DAG processor and triggerer as processes
(tests/support/airflow_services.py), the React UI in Debian's Chromium driven by Playwright,
MariaDB, and ``dblog stream`` writing Delta. Nobody starts the stream but Airflow: the
``dblog_keep_alive`` DAG's first run starts it (locally, detached from its task) and its lag
sensor logs a real lag (bytes and seconds behind the binlog). Then the backfill: the form offers
two captured tables, so choosing ``orders`` is a real choice; the keys mix both composite-key
spellings the DAG documents, and the table has rows in another region with the same ids, so a
key that lost its second column would show up as a wrong row. The backfill's Asset event starts
the downstream example DAG ``dblog_on_refresh`` for ``orders`` alone. Last, the stream is killed
(SIGKILL) and the next keep-alive run notices and starts it again. Screenshots of the finished
runs go to ``$DBLOG_ARTIFACTS`` (default ``<repo>/test-artifacts``) for people and CI to look at.

The same Airflow also shows, while the stream starts, the ``dblog`` connection form as the UI
reads it (the fields of the provider info's ``conn-fields``, the secret ones as passwords, and
masked when a connection is read back).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from airflow_dblog.config import load_config
from airflow_dblog.engine.launcher import Launch, alive, pid_path, read_record, stop
from tests.support.airflow_services import REPO_ROOT, AirflowServices, running_airflow
from tests.support.stream_process import TEST_SPARK_CONF

if TYPE_CHECKING:
    from playwright.sync_api import Page

pytestmark = [pytest.mark.integration, pytest.mark.slow]

DAG_ID = "dblog_backfill"
DOWNSTREAM_DAG_ID = "dblog_on_refresh"
KEEP_ALIVE_DAG_ID = "dblog_keep_alive"
KEYS_TYPED = '[3, "eu"]\n{"id": 7, "region": "eu"}\n[42, "eu"]'
WANTED = {(k, "eu"): k * 10 for k in (3, 7, 42)}
RUN_TIMEOUT_S = 300


def chromium_path() -> str:
    """Debian's Chromium (scripts/test.sh installs it); ``DBLOG_CHROMIUM`` overrides."""
    for candidate in (
        os.environ.get("DBLOG_CHROMIUM"),
        "/usr/bin/chromium",
        shutil.which("chromium"),
        shutil.which("chromium-browser"),
    ):
        if candidate and os.access(candidate, os.X_OK):
            return candidate
    pytest.fail("no Chromium found: `apt-get install chromium` (scripts/test.sh does it)")


def artifacts_dir() -> Path:
    path = Path(os.environ.get("DBLOG_ARTIFACTS") or REPO_ROOT / "test-artifacts")
    path.mkdir(parents=True, exist_ok=True)
    return path


@pytest.fixture
def config_file(mysql_db: Any, tmp_path: Path) -> Path:
    """Two captured tables; ``orders`` holds ids 0..99 in "eu" and ids 3 and 7 in "us" too."""
    conn = mysql_db.connect()
    with conn.cursor() as cur:
        cur.execute("CREATE TABLE customers (id INT PRIMARY KEY, name VARCHAR(20))")
        cur.executemany("INSERT INTO customers VALUES (%s, %s)", [(i, f"c{i}") for i in range(5)])
        cur.execute(
            "CREATE TABLE orders (id INT, region VARCHAR(8), total INT, PRIMARY KEY (id, region))"
        )
        rows = [(i, "eu", i * 10) for i in range(100)] + [(3, "us", 1), (7, "us", 1)]
        cur.executemany("INSERT INTO orders VALUES (%s, %s, %s)", rows)
    conn.close()
    db = mysql_db.name
    file = tmp_path / "dblog.yaml"
    file.write_text(
        f"""
name: browser-e2e
source: {{type: mysql, url: "{mysql_db.url}", tables: [{db}.customers, {db}.orders]}}
metadata: {{url: "sqlite:///{tmp_path}/meta.db"}}
dump: {{chunk_size: 40}}
sinks: {{delta: {{path: {tmp_path}/delta}}}}
checkpoint: {tmp_path}/cp
spark:
  master: "local[2]"
  conf: {json.dumps(TEST_SPARK_CONF)}
"""
    )
    return file


@pytest.fixture
def airflow(config_file: Path, postgres_db: Any, tmp_path: Path) -> Iterator[AirflowServices]:
    """Airflow with the example DAGs on ``config_file``; at the end, the stream it started is
    stopped (SIGTERM to its session, SIGKILL after 30 s)."""
    try:
        with running_airflow(
            tmp_path / "airflow-home",
            postgres_db.sqlalchemy_url,
            {"DBLOG_CONFIG": str(config_file)},
            DAG_ID,
        ) as services:
            yield services
    finally:
        record = read_record(pid_path(load_config(config_file), Launch()))
        if record is not None:
            stop(record)


@pytest.fixture
def page() -> Iterator[Page]:
    """A page of Debian's Chromium, headless; Playwright is only the remote control."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=chromium_path(), headless=True)
        context = browser.new_context(viewport={"width": 1400, "height": 1000})
        context.set_default_timeout(30_000)
        yield context.new_page()
        browser.close()


def trigger_from_form(page: Page, airflow: AirflowServices, table: str) -> None:
    """The DAG page's Trigger button, the table chosen in its select, the keys typed, submit."""
    page.goto(f"{airflow.url}/dags/{DAG_ID}")
    page.get_by_role("button", name="Trigger").click()
    dialog = page.get_by_role("dialog")
    dialog.get_by_role("combobox", name="Table").click()
    page.get_by_role("option", name=table, exact=True).click()
    # The select (react-select) keeps its value in a hidden input named after the param.
    assert dialog.locator('input[name="element_table"]').input_value() == table
    dialog.locator('textarea[name="element_keys"]').fill(KEYS_TYPED)
    page.screenshot(path=str(artifacts_dir() / "browser_e2e_trigger_form.png"))
    dialog.get_by_test_id("trigger-dag-submit").click()
    dialog.wait_for(state="hidden")


def check_stream_alive(config_file: Path) -> None:
    record = read_record(pid_path(load_config(config_file), Launch()))
    if record is None or not alive(record):
        log = config_file.parent / "cp" / "launcher" / "stream.log"
        tail = log.read_text(errors="replace")[-3000:] if log.exists() else "(no log)"
        pytest.fail(f"the stream the keep-alive DAG started is not running:\n{tail}")


def wait_for_run(airflow: AirflowServices, config_file: Path) -> dict[str, Any]:
    """The one run of the DAG, once it has finished (success or failed)."""
    deadline = time.monotonic() + RUN_TIMEOUT_S
    runs: list[dict[str, Any]] = []
    while time.monotonic() < deadline:
        airflow.check_alive()
        check_stream_alive(config_file)
        runs = airflow.api(f"dags/{DAG_ID}/dagRuns")["dag_runs"]
        assert len(runs) <= 1, runs
        if runs and runs[0]["state"] in ("success", "failed"):
            return runs[0]
        time.sleep(2)
    pytest.fail(f"no finished run of {DAG_ID} after {RUN_TIMEOUT_S}s: {runs}")


def check_connection_form(airflow: AirflowServices) -> None:
    """The dblog type's form as the UI gets it, and a connection's secret read back masked.

    (The path avoids the word "dblog": it is the services' database password here, which the
    API server masks wherever it appears.)
    """
    types = {t["connection_type"]: t for t in airflow.api("connections/hook_meta", prefix="ui")}
    dblog = types["dblog"]
    fields = dblog["extra_fields"]
    assert {name: f["schema"]["title"] for name, f in fields.items()} == {
        "config": "Config file",
        "config_yaml": "Config (YAML)",
        "source_password": "Source password",
        "metadata_password": "Metadata password",
    }
    secret = {name for name, f in fields.items() if f["schema"].get("format") == "password"}
    assert secret == {"source_password", "metadata_password"}
    assert fields["config_yaml"]["schema"]["format"] == "multiline"
    assert (
        dblog["standard_fields"]["host"]["hidden"]
        and dblog["standard_fields"]["password"]["hidden"]
    )
    extra = {"config": "/opt/streams/inventory.yaml", "source_password": "Conn-secret-never-shown"}
    airflow.api(
        "connections",
        {"connection_id": "dblog_form", "conn_type": "dblog", "extra": json.dumps(extra)},
        method="POST",
    )
    read_back = json.loads(airflow.api("connections/dblog_form")["extra"])
    assert read_back == {"config": "/opt/streams/inventory.yaml", "source_password": "***"}


def wait_for_downstream_run(airflow: AirflowServices, timeout: float = 120) -> dict[str, Any]:
    """The run of the downstream DAG the backfill's Asset event started, once finished."""
    deadline = time.monotonic() + timeout
    runs: list[dict[str, Any]] = []
    while time.monotonic() < deadline:
        airflow.check_alive()
        runs = airflow.api(f"dags/{DOWNSTREAM_DAG_ID}/dagRuns")["dag_runs"]
        if runs and all(r["state"] in ("success", "failed") for r in runs):
            assert len(runs) == 1, runs
            return runs[0]
        time.sleep(2)
    pytest.fail(f"no finished run of {DOWNSTREAM_DAG_ID} after {timeout:.0f}s: {runs}")


def keep_alive_runs(
    airflow: AirflowServices, seen: set[str], timeout: float = 300
) -> dict[str, dict[str, Any]]:
    """The keep-alive runs not in ``seen``, once there is one and all have succeeded: per run,
    what ``ensure_stream`` returned, its log, and the lines of ``check_lag``'s logs (its
    trigger's too) that report the lag. (Unpausing the DAG schedules a run; a scheduled run
    may also come between the test's own: whichever run finds the stream down starts it.)"""
    deadline = time.monotonic() + timeout
    runs: list[dict[str, Any]] = []
    while time.monotonic() < deadline:
        airflow.check_alive()
        runs = airflow.api(f"dags/{KEEP_ALIVE_DAG_ID}/dagRuns")["dag_runs"]
        runs = [r for r in runs if r["dag_run_id"] not in seen]
        if runs and all(r["state"] in ("success", "failed") for r in runs):
            break
        time.sleep(2)
    else:
        pytest.fail(f"keep-alive runs unfinished after {timeout:.0f}s: {runs}")
    found = {}
    for run in runs:
        run_id = run["dag_run_id"]
        path = f"dags/{KEEP_ALIVE_DAG_ID}/dagRuns/{run_id}/taskInstances"
        states = {t["task_id"]: t["state"] for t in airflow.api(path)["task_instances"]}
        assert run["state"] == "success", (run, states)
        logs = airflow.home / "logs" / f"dag_id={KEEP_ALIVE_DAG_ID}" / f"run_id={run_id}"
        found[run_id] = {
            "ensured": airflow.api(f"{path}/ensure_stream/xcomEntries/return_value")["value"],
            "ensure_log": "".join(p.read_text() for p in logs.glob("task_id=ensure_stream/*")),
            "lag_lines": [
                line
                for p in sorted(logs.glob("task_id=check_lag/*"))
                for line in p.read_text().splitlines()
                if "state=" in line
            ],
        }
    return found


def the_start(runs: dict[str, dict[str, Any]]) -> tuple[str, dict[str, Any]]:
    """The one run that started the stream; every other one found it running."""
    starts = [(run_id, r) for run_id, r in runs.items() if r["ensured"]["started"]]
    assert len(starts) == 1, runs
    for run_id, r in runs.items():
        if run_id != starts[0][0]:
            assert "stream browser-e2e is running: process " in r["ensure_log"], r
    return starts[0]


REAL_LAG = re.compile(r"state=running lag_s=\d+(\.\d+)? lag_bytes=\d+")


def delta_rows(spark: Any, path: Path) -> dict[tuple[Any, ...], int]:
    df = spark.read.format("delta").load(str(path))
    return {(r["id"], r["region"]): r["total"] for r in df.collect()}


def test_keep_alive_starts_the_stream_the_browser_backfills_and_a_killed_stream_comes_back(
    airflow: AirflowServices,
    config_file: Path,
    page: Page,
    mysql_db: Any,
    request: pytest.FixtureRequest,
) -> None:
    table = f"{mysql_db.name}.orders"
    screenshot = artifacts_dir() / "browser_e2e_backfill_run.png"
    password = mysql_db.url.split("://", 1)[1].split("@", 1)[0].partition(":")[2]
    started = time.monotonic()
    with airflow.logs_on_failure():
        airflow.wait_healthy(KEEP_ALIVE_DAG_ID)
        # unpaused, the DAG schedules its latest interval's run: the stream starts
        airflow.api(f"dags/{KEEP_ALIVE_DAG_ID}", {"is_paused": False}, method="PATCH")
        check_connection_form(airflow)  # while the first keep-alive run starts the stream
        airflow.wait_healthy(DOWNSTREAM_DAG_ID)
        airflow.api(f"dags/{DOWNSTREAM_DAG_ID}", {"is_paused": False}, method="PATCH")
        print(f"connection form checked after {time.monotonic() - started:.0f}s")
        first_runs = keep_alive_runs(airflow, set())
        print(f"keep-alive started the stream after {time.monotonic() - started:.0f}s")
        _, first = the_start(first_runs)
        pid = first["ensured"]["pid"]
        assert f"started stream browser-e2e: pid {pid}, log " in first["ensure_log"]
        assert password and f":{password}@" not in first["ensure_log"]  # the URL's is redacted
        assert any(REAL_LAG.search(line) for line in first["lag_lines"]), first["lag_lines"]
        print("lag reported:", next(line for line in first["lag_lines"] if REAL_LAG.search(line)))
        check_stream_alive(config_file)
        try:
            trigger_from_form(page, airflow, table)
        except BaseException:
            page.screenshot(path=str(artifacts_dir() / "browser_e2e_trigger_failed.png"))
            raise
        spark = request.getfixturevalue("spark")  # its JVM starts while the DAG runs
        print(f"spark ready after {time.monotonic() - started:.0f}s")
        run = wait_for_run(airflow, config_file)
        print(f"run {run['state']} after {time.monotonic() - started:.0f}s")
        page.goto(f"{airflow.url}/dags/{DAG_ID}/runs/{run['dag_run_id']}")
        page.get_by_role("row").filter(has_text="wait_for_backfill").wait_for()  # table loaded
        try:
            tasks = airflow.api(f"dags/{DAG_ID}/dagRuns/{run['dag_run_id']}/taskInstances")
            states = {t["task_id"]: t["state"] for t in tasks["task_instances"]}
            assert run["state"] == "success", states
            assert states == {"plan_backfill": "success", "wait_for_backfill": "success"}
            for task_id in states:  # the page shows it too, before it is photographed
                row = page.get_by_role("row").filter(has_text=task_id)
                row.get_by_text("Success", exact=True).wait_for()
        finally:
            page.screenshot(path=str(screenshot), full_page=True)
        assert run["conf"] == {"table": table, "keys": KEYS_TYPED}
        downstream = wait_for_downstream_run(airflow)
        print(f"downstream run {downstream['state']} after {time.monotonic() - started:.0f}s")
        sink = load_config(config_file).delta
        assert sink is not None
        delta = Path(sink.path)
        assert downstream["state"] == "success" and downstream["run_type"] == "asset_triggered"
        events = airflow.api(
            f"dags/{DOWNSTREAM_DAG_ID}/dagRuns/{downstream['dag_run_id']}/upstreamAssetEvents"
        )["asset_events"]
        assert [(e["uri"], e["source_dag_id"], e["source_task_id"]) for e in events] == [
            (f"file://{delta}/{mysql_db.name}/orders", DAG_ID, "wait_for_backfill")
        ]
        assert events[0]["extra"]["rows_emitted"] == 3 and events[0]["extra"]["table"] == table

        os.kill(pid, signal.SIGKILL)  # the stream dies; its last commit is still fresh
        body = {"dag_run_id": "keep-alive-2", "logical_date": None}
        airflow.api(f"dags/{KEEP_ALIVE_DAG_ID}/dagRuns", body, method="POST")
        second_runs = keep_alive_runs(airflow, set(first_runs))
        print(f"keep-alive restarted the stream after {time.monotonic() - started:.0f}s")
        restart_run, second = the_start(second_runs)
        assert second["ensured"]["pid"] != pid
        assert any(REAL_LAG.search(line) for line in second["lag_lines"]), second["lag_lines"]
        check_stream_alive(config_file)
        try:  # the killed driver's Spark JVM ends with its stdin; nothing of its session is left
            os.killpg(pid, 0)
            os.killpg(pid, signal.SIGKILL)
            pytest.fail(f"processes of the killed stream's session {pid} outlived it")
        except ProcessLookupError:
            pass
        page.goto(f"{airflow.url}/dags/{KEEP_ALIVE_DAG_ID}/runs/{restart_run}")
        row = page.get_by_role("row").filter(has_text="check_lag")
        row.get_by_text("Success", exact=True).wait_for()
        shot = artifacts_dir() / "browser_e2e_keep_alive_restart.png"
        page.screenshot(path=str(shot), full_page=True)
        page.goto(f"{airflow.url}/dags/{KEEP_ALIVE_DAG_ID}/runs/{restart_run}/tasks/check_lag")
        page.get_by_text(REAL_LAG).first.wait_for()  # the lag line, as people read it in the UI
        page.screenshot(path=str(artifacts_dir() / "browser_e2e_lag_log.png"), full_page=True)
        stream_log = (config_file.parent / "cp" / "launcher" / "stream.log").read_text()
        launches = [line for line in stream_log.splitlines() if "by the dblog launcher" in line]
        assert len(launches) == 2 and all(f":{password}@" not in line for line in launches)

    assert screenshot.stat().st_size > 10_000
    print(f"screenshots checked after {time.monotonic() - started:.0f}s")
    assert delta_rows(spark, delta / mysql_db.name / "orders") == WANTED
    # the stream created both tables when it started; the backfill of orders wrote none there
    assert spark.read.format("delta").load(str(delta / mysql_db.name / "customers")).count() == 0
    print(f"delta checked after {time.monotonic() - started:.0f}s")
