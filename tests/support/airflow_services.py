"""A real Airflow 3 (API server, scheduler, DAG processor, triggerer) as child processes.

The browser test needs Airflow as people run it, not ``dag.test()``: the UI's trigger form, the
scheduler handing tasks to the LocalExecutor, the deferrable sensor resumed by the triggerer.
Everything lives in a throwaway AIRFLOW_HOME; the metadata database is a PostgreSQL database
the caller provides (SQLite serialises every writer of four processes and their task
subprocesses, which is slow and can time out on a busy 2-core machine). Authentication is
SimpleAuthManager with ``simple_auth_manager_all_admins``: every request, the browser's and the
REST API's, is an admin, so there is no login page to drive.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import secrets
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[2]
COMPONENTS = ("api-server", "scheduler", "dag-processor", "triggerer")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class AirflowServices:
    """The four Airflow components of one throwaway AIRFLOW_HOME, and their logs."""

    def __init__(self, home: Path, sql_alchemy_conn: str, extra_env: dict[str, str]) -> None:
        self.home = home
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        # Inherited AIRFLOW_* settings (the in-process tests' conftest sets some) must not leak.
        env = {k: v for k, v in os.environ.items() if not k.startswith("AIRFLOW")}
        env.update(
            {
                "AIRFLOW_HOME": str(home),
                "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": sql_alchemy_conn,
                "AIRFLOW__CORE__EXECUTOR": "LocalExecutor",
                "AIRFLOW__CORE__PARALLELISM": "4",
                "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
                "AIRFLOW__CORE__DAGS_FOLDER": str(REPO_ROOT / "dags"),
                # The other example DAGs are scheduled: paused, they cannot dump behind our back.
                "AIRFLOW__CORE__DAGS_ARE_PAUSED_AT_CREATION": "True",
                "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_ALL_ADMINS": "True",
                "AIRFLOW__CORE__FERNET_KEY": base64.urlsafe_b64encode(os.urandom(32)).decode(),
                "AIRFLOW__CORE__EXECUTION_API_SERVER_URL": f"{self.url}/execution/",
                "AIRFLOW__API__HOST": "127.0.0.1",
                "AIRFLOW__API__PORT": str(self.port),
                "AIRFLOW__API__BASE_URL": self.url,
                "AIRFLOW__API__WORKERS": "1",
                "AIRFLOW__API__SECRET_KEY": secrets.token_hex(16),
                # One secret for all processes: the API server checks the tasks' JWTs with it.
                "AIRFLOW__API_AUTH__JWT_SECRET": secrets.token_hex(32),
                # Log servers on free ports, so a second Airflow on the machine does not clash.
                "AIRFLOW__LOGGING__WORKER_LOG_SERVER_PORT": str(free_port()),
                "AIRFLOW__LOGGING__TRIGGER_LOG_SERVER_PORT": str(free_port()),
                "AIRFLOW__DAG_PROCESSOR__REFRESH_INTERVAL": "5",
                "PYTHONUNBUFFERED": "1",
            }
        )
        env.update(extra_env)
        self.env = env

    def log(self, component: str) -> Path:
        return self.home / f"{component}.log"

    def migrate(self) -> None:
        result = subprocess.run(
            [sys.executable, "-m", "airflow", "db", "migrate"],
            env=self.env,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=600,
            check=False,
        )
        if result.returncode != 0:
            raise RuntimeError(
                f"airflow db migrate failed:\n{result.stdout[-3000:]}{result.stderr}"
            )

    def start(self) -> None:
        for component in COMPONENTS:
            with open(self.log(component), "ab") as out:
                # Own session: stop() can end the component's workers with it.
                self.procs[component] = subprocess.Popen(
                    [sys.executable, "-m", "airflow", component],
                    env=self.env,
                    cwd=self.home,
                    stdin=subprocess.DEVNULL,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                )

    def api(
        self,
        path: str,
        body: dict[str, Any] | None = None,
        method: str = "GET",
        prefix: str = "api/v2",
    ) -> Any:
        """``/api/v2/<path>`` (``prefix="ui"``: the UI's own API) with an optional JSON
        ``body``; the parsed JSON answer."""
        request = urllib.request.Request(
            f"{self.url}/{prefix}/{path}",
            data=None if body is None else json.dumps(body).encode(),
            headers={"Content-Type": "application/json"},
            method=method,
        )
        with urllib.request.urlopen(request, timeout=30) as response:
            return json.loads(response.read())

    def check_alive(self) -> None:
        for component, proc in self.procs.items():
            if proc.poll() is not None:
                raise RuntimeError(
                    f"airflow {component} exited with {proc.returncode}\n{self.log_tails()}"
                )

    def wait_healthy(self, dag_id: str, timeout: float = 240.0) -> None:
        """Until every component reports healthy and the DAG processor has parsed ``dag_id``."""
        deadline = time.monotonic() + timeout
        last: Any = None
        while time.monotonic() < deadline:
            self.check_alive()
            try:
                last = self.api("monitor/health")
                healthy = all(
                    last.get(part, {}).get("status") == "healthy"
                    for part in ("metadatabase", "scheduler", "triggerer", "dag_processor")
                )
                if healthy and self.api(f"dags/{dag_id}")["dag_id"] == dag_id:
                    return
            except (OSError, urllib.error.URLError, ValueError) as exc:
                last = exc  # not listening yet, or the DAG not parsed yet (404)
            time.sleep(1)
        raise RuntimeError(
            f"airflow not ready after {timeout:.0f}s (last answer: {last})\n{self.log_tails()}"
        )

    def stop(self) -> None:
        """SIGTERM each component, SIGKILL what is left of its process group after 30 s."""
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + 30
        for proc in self.procs.values():
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(max(0.1, deadline - time.monotonic()))
        for proc in self.procs.values():
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGKILL)  # also workers that outlived their parent
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(10)

    def log_tails(self, lines: int = 40) -> str:
        """The last lines of each component's log and of every task log so far."""
        paths = [self.log(component) for component in COMPONENTS]
        paths += sorted((self.home / "logs").glob("dag_id=*/**/*.log"))
        out = []
        for path in paths:
            text = path.read_text(errors="replace") if path.exists() else "(no log)"
            tail = "\n".join(text.splitlines()[-lines:])
            out.append(f"----- {path.relative_to(self.home)} -----\n{tail}")
        return "\n".join(out)

    @contextlib.contextmanager
    def logs_on_failure(self) -> Iterator[None]:
        """Print the tail of every component's log if the block fails (pytest shows it)."""
        try:
            yield
        except BaseException:
            print(self.log_tails())
            raise


@contextlib.contextmanager
def running_airflow(
    home: Path, sql_alchemy_conn: str, extra_env: dict[str, str], dag_id: str
) -> Iterator[AirflowServices]:
    """Migrate the database, start the four components, wait for ``dag_id`` and unpause it."""
    home.mkdir(parents=True, exist_ok=True)
    airflow = AirflowServices(home, sql_alchemy_conn, extra_env)
    airflow.migrate()
    try:
        airflow.start()
        airflow.wait_healthy(dag_id)
        airflow.api(f"dags/{dag_id}", {"is_paused": False}, method="PATCH")
        yield airflow
    finally:
        airflow.stop()
