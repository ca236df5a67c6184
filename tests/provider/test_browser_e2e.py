"""The backfill DAG as a person uses it: Airflow's trigger form in headless Chromium.

Everything is real: Airflow's API server, scheduler, DAG processor and triggerer as processes
(tests/provider/airflow_services.py), the React UI in Debian's Chromium driven by Playwright,
MariaDB, and ``dblog stream`` writing Delta. The form offers two captured tables, so choosing
``orders`` is a real choice; the keys mix both composite-key spellings the DAG documents, and
the table has rows in another region with the same ids, so a key that lost its second column
would show up as a wrong row. A screenshot of the finished run goes to ``$DBLOG_ARTIFACTS``
(default ``<repo>/test-artifacts``) for people and CI to look at.

The same Airflow also shows, while the stream warms up, the ``dblog`` connection form as the UI
reads it (the fields of the provider info's ``conn-fields``, the secret ones as passwords, and
masked when a connection is read back), and after the run, that the backfill's Asset event
started the downstream example DAG ``dblog_on_refresh`` for ``orders`` alone.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from airflow_services import REPO_ROOT, AirflowServices, running_airflow
from stream_process import Stream

from airflow_dblog.config import load_config

if TYPE_CHECKING:
    from playwright.sync_api import Page

pytestmark = [pytest.mark.integration, pytest.mark.slow]

DAG_ID = "dblog_backfill"
DOWNSTREAM_DAG_ID = "dblog_on_refresh"
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
spark: {{master: "local[2]", conf: {{spark.ui.enabled: false}}}}
"""
    )
    return file


@pytest.fixture
def stream(config_file: Path) -> Iterator[Stream]:
    """``dblog stream`` started, not yet waited for: its JVM warms up while Airflow starts."""
    process = Stream(config_file)
    process.start()
    yield process
    assert process.stop() == 0


@pytest.fixture
def airflow(stream: Stream, postgres_db: Any, tmp_path: Path) -> Iterator[AirflowServices]:
    with running_airflow(
        tmp_path / "airflow-home",
        postgres_db.sqlalchemy_url,
        {"DBLOG_CONFIG": str(stream.config_path)},
        DAG_ID,
    ) as services:
        yield services


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


def wait_for_run(airflow: AirflowServices, stream: Stream) -> dict[str, Any]:
    """The one run of the DAG, once it has finished (success or failed)."""
    deadline = time.monotonic() + RUN_TIMEOUT_S
    runs: list[dict[str, Any]] = []
    while time.monotonic() < deadline:
        airflow.check_alive()
        stream.check_alive()
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


def delta_rows(spark: Any, path: Path) -> dict[tuple[Any, ...], int]:
    df = spark.read.format("delta").load(str(path))
    return {(r["id"], r["region"]): r["total"] for r in df.collect()}


def test_backfill_triggered_from_the_browser_writes_the_three_keys_to_delta(
    airflow: AirflowServices,
    stream: Stream,
    page: Page,
    mysql_db: Any,
    request: pytest.FixtureRequest,
) -> None:
    table = f"{mysql_db.name}.orders"
    screenshot = artifacts_dir() / "browser_e2e_backfill_run.png"
    started = time.monotonic()
    with airflow.logs_on_failure():
        check_connection_form(airflow)  # while the stream warms up
        airflow.wait_healthy(DOWNSTREAM_DAG_ID)
        airflow.api(f"dags/{DOWNSTREAM_DAG_ID}", {"is_paused": False}, method="PATCH")
        print(f"connection form checked after {time.monotonic() - started:.0f}s")
        stream.wait_capturing(240)
        print(f"stream ready after {time.monotonic() - started:.0f}s")
        try:
            trigger_from_form(page, airflow, table)
        except BaseException:
            page.screenshot(path=str(artifacts_dir() / "browser_e2e_trigger_failed.png"))
            raise
        spark = request.getfixturevalue("spark")  # its JVM starts while the DAG runs
        print(f"spark ready after {time.monotonic() - started:.0f}s")
        run = wait_for_run(airflow, stream)
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
        sink = load_config(stream.config_path).delta
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

    assert screenshot.stat().st_size > 10_000
    print(f"screenshot checked after {time.monotonic() - started:.0f}s")
    assert delta_rows(spark, delta / mysql_db.name / "orders") == WANTED
    assert not (delta / mysql_db.name / "customers").exists()
    print(f"delta checked after {time.monotonic() - started:.0f}s")
