"""Keep the streaming job running: start ``dblog stream`` unless it runs, then wait until it does.

**Is it running?** In this order, the first that answers decides:

1. The process this module last started for the stream (its pid file) is alive: running.
2. With ``ha``: a process is queued on the ZooKeeper leader lease (a leader, or a standby
   that will take over) and it is not the one this module started and saw die: running. The
   lease is the authority; the metadata is not consulted.
3. Without ``ha``: the stream committed within ``stale_after_s`` (``stream_status`` says
   ``running``). When the process this module started has died, that commit may be its last
   (a ``kill -9`` leaves one behind that looks fresh for a minute, and waiting it out would
   leave the stream down that long): then the stream counts as running only if it commits
   again within ``probe_s`` (a running stream commits every second or so). Started elsewhere
   without ``ha`` (a cluster scheduler, by hand), the stream is only known by its commits;
   two streams without ``ha`` are unsafe, so use ``ha`` where more than one thing may start
   it.

**Starting it** runs ``dblog stream -c FILE`` (``mode="local"``: the stream's own
``spark.master``, e.g. ``local[*]``) or ``spark-submit ... airflow_dblog/cli/spark_submit.py -c
FILE`` (``mode="spark-submit"``: master and resources from spark-submit's arguments; in client
deploy mode, the only one standalone clusters offer Python jobs, the driver runs in that
process) as a detached process: its own session, so it outlives the Airflow task that started
it and no signal to the task's process group reaches it; output appended to a log file (default
``<checkpoint>/launcher/stream.log``); its pid, start time and command recorded next to it
(``stream.pid``). Then it waits, bounded, until the new process has committed twice (two
heartbeats newer than its start): a new stream's first one only saves its start position, before
Spark is up; the next comes from a batch the sinks hold, so the whole job works and
``stream_status`` says ``running``. A process that exits
first, or a stream that does not commit in time (the process is then stopped, so the next
attempt starts afresh), fails with one line naming the log file.

**Why not Airflow's Apache Spark provider** (``SparkSubmitHook``): its ``submit()`` runs
spark-submit and follows its output until it exits, the shape of a batch job; a stream that
must outlive the task would block it forever, and ``on_kill`` ends it with the task. Only its
private command builder would be of use. And its dependencies: the provider requires
``pyspark-client``, a Spark Connect client that installs its own ``pyspark`` package over the
full ``pyspark`` this package's ``[spark]`` extra needs (plus grpc and others this package does
not use). One ``subprocess.Popen`` of spark-submit is less code than adapting it.

Plain Python, no Airflow: the operator (``DblogEnsureStreamOperator`` in
``provider/operators/dblog.py``) is a thin adapter.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

from airflow_dblog.config import Config
from airflow_dblog.engine import connector_jars
from airflow_dblog.engine.lag import STALE_AFTER_S, StreamStatus, stream_status
from airflow_dblog.engine.metadata import MetadataStore
from airflow_dblog.errors import DblogError
from airflow_dblog.redact import redact

log = logging.getLogger(__name__)

MODES = ("local", "spark-submit")
#: the stream's spark-submit application, a file of this package (found by path: importing it
#: would import the layers above the engine)
DEFAULT_APPLICATION = Path(__file__).resolve().parents[1] / "cli" / "spark_submit.py"


class LaunchError(DblogError):
    """The stream could not be started, or did not come up in time."""


@dataclass(frozen=True)
class Launch:
    """Where and how to start the stream, and how long to wait for it."""

    mode: str = "local"
    log_path: str | None = None  # default <run_dir>/stream.log
    run_dir: str | None = None  # pid file (and default log); default <checkpoint>/launcher
    python: str = sys.executable  # the interpreter with airflow-dblog[spark] (spark-submit: the
    # driver's, unless PYSPARK_DRIVER_PYTHON is set)
    spark_submit: str = "spark-submit"  # mode spark-submit: the binary
    application: str | None = None  # mode spark-submit: default DEFAULT_APPLICATION
    spark_args: Sequence[str] = ()  # mode spark-submit: e.g. ["--master", "spark://m:7077"]
    env: Mapping[str, str] = field(default_factory=dict)  # added to the process's environment
    timeout_s: float = 120.0
    poll_s: float = 2.0
    stale_after_s: float = STALE_AFTER_S
    probe_s: float = 5.0  # how long a fresh commit left by a dead process must stay the last

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise LaunchError(
                f"unknown launch mode {self.mode!r}", f"use one of {', '.join(MODES)}"
            )


@dataclass(frozen=True)
class Ensured:
    """What :func:`ensure_stream` did: ``started`` is False when the stream already ran."""

    started: bool
    reason: str  # one line: why nothing was done, or what was started
    pid: int | None = None
    log_path: str | None = None
    status: StreamStatus | None = None


@dataclass(frozen=True)
class ProcessRecord:
    """A started stream process, as its pid file keeps it."""

    pid: int
    start_ticks: int | None  # /proc/<pid>/stat start time: a reused pid is not ours
    command: list[str]  # redacted
    log_path: str
    started_at: str  # ISO, UTC


# -- where ---------------------------------------------------------------------------------------


def run_dir(config: Config, launch: Launch) -> Path:
    """``launch.run_dir``, else ``<checkpoint>/launcher`` (a local checkpoint only)."""
    if launch.run_dir:
        return Path(launch.run_dir)
    if "://" in config.checkpoint and not config.checkpoint.startswith("file://"):
        raise LaunchError(
            f"checkpoint {config.checkpoint} is not a local folder for the launcher's pid file",
            "pass run_dir, a folder on the machine that starts the stream",
        )
    return Path(config.checkpoint.removeprefix("file://")) / "launcher"


def log_path(config: Config, launch: Launch) -> Path:
    return Path(launch.log_path) if launch.log_path else run_dir(config, launch) / "stream.log"


def pid_path(config: Config, launch: Launch) -> Path:
    return run_dir(config, launch) / "stream.pid"


def stream_command(config_path: str, launch: Launch) -> list[str]:
    """The command that runs the stream of ``config_path``."""
    if launch.mode == "local":
        return [launch.python, "-m", "airflow_dblog.cli", "stream", "-c", config_path]
    application = launch.application or str(DEFAULT_APPLICATION)
    if not Path(application).is_file():
        raise LaunchError(
            f"spark-submit application {application} not found",
            "pass application, the path of airflow_dblog/cli/spark_submit.py on this machine",
        )
    args = list(launch.spark_args)
    if "--jars" not in args:  # Delta and Kafka must be on the driver's classpath from its start
        args += ["--jars", ",".join(connector_jars.spark_jars())]
    return [launch.spark_submit, *args, application, "-c", config_path]


# -- the process ---------------------------------------------------------------------------------


def _start_ticks(pid: int) -> int | None:
    """The process's start time in clock ticks since boot (Linux), None elsewhere or gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return int(stat.rpartition(")")[2].split()[19])


def _state(pid: int) -> str | None:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0]
    except OSError:
        return None


def alive(record: ProcessRecord) -> bool:
    """Whether the recorded process still runs (not a zombie, not another process on its pid)."""
    try:
        os.kill(record.pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # exists, another user's: the start time below decides
    if Path("/proc/self/stat").exists():
        if _state(record.pid) in (None, "Z", "X"):
            return False
        return record.start_ticks is None or _start_ticks(record.pid) == record.start_ticks
    return True


def read_record(path: Path) -> ProcessRecord | None:
    try:
        data = json.loads(path.read_text())
        return ProcessRecord(**data)
    except (OSError, ValueError, TypeError):
        return None


def start(config_path: str, config: Config, launch: Launch) -> ProcessRecord:
    """Start the stream as a detached process and record it; returns the record."""
    command = stream_command(config_path, launch)
    logfile = log_path(config, launch)
    logfile.parent.mkdir(parents=True, exist_ok=True)
    pidfile = pid_path(config, launch)
    pidfile.parent.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "PYTHONUNBUFFERED": "1", **launch.env}
    if launch.mode == "spark-submit":  # the driver runs in the Python that has airflow-dblog
        env.setdefault("PYSPARK_DRIVER_PYTHON", launch.python)
    shown = [redact(part) for part in command]
    with open(logfile, "ab") as out:
        stamp = datetime.now(timezone.utc).isoformat(timespec="seconds")
        out.write(f"\n----- {stamp} started by the dblog launcher: {' '.join(shown)}\n".encode())
        out.flush()
        try:
            proc = subprocess.Popen(
                command,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                env=env,
                start_new_session=True,  # outlives the task; the task's group signals miss it
                close_fds=True,
            )
        except OSError as err:
            raise LaunchError(
                f"cannot run {shown[0]}: {err.strerror}",
                "install it or pass its path (python / spark_submit)",
            ) from None
    record = ProcessRecord(
        pid=proc.pid,
        start_ticks=_start_ticks(proc.pid),
        command=shown,
        log_path=str(logfile),
        started_at=stamp,
    )
    tmp = pidfile.with_suffix(".tmp")
    tmp.write_text(json.dumps(record.__dict__))
    tmp.replace(pidfile)
    _children[proc.pid] = proc
    return record


# Popen objects of processes started here: their exit code, and no zombie while we wait
_children: dict[int, subprocess.Popen[bytes]] = {}


def _exit_code(record: ProcessRecord) -> int | None:
    """The exit code once the process ended (-N: killed by signal N), else None."""
    proc = _children.get(record.pid)
    if proc is not None:
        return proc.poll()
    return None if alive(record) else -1


def stop(record: ProcessRecord, grace_s: float = 30.0) -> None:
    """SIGTERM the process's session, then SIGKILL what is left of it once the process ended or
    after ``grace_s``: Spark's JVM, or under spark-submit the Python driver it started."""
    try:
        os.killpg(record.pid, signal.SIGTERM)
    except (ProcessLookupError, PermissionError):
        return  # nothing of the session is left
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline and _exit_code(record) is None:
        time.sleep(0.2)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(record.pid, signal.SIGKILL)
    proc = _children.pop(record.pid, None)
    if proc is not None:
        proc.wait(10)


# -- is it running? ------------------------------------------------------------------------------


def lease_holders(config: Config) -> list[str]:
    """The identities queued on the stream's ZooKeeper lease, the leader first ([] without ha)."""
    if config.ha is None:
        return []
    from kazoo.client import KazooClient
    from kazoo.handlers.threading import KazooTimeoutError

    client = KazooClient(hosts=config.ha.zookeeper, timeout=config.ha.session_timeout_s)
    try:
        client.start(timeout=config.ha.session_timeout_s)
    except KazooTimeoutError:
        raise LaunchError(
            f"cannot reach ZooKeeper at {config.ha.zookeeper} to see who leads {config.name}",
            "check ha.zookeeper and the ensemble",
        ) from None
    try:
        return list(client.Lock(f"/dblog/{config.name}/leader").contenders())
    finally:
        client.stop()
        client.close()


def running_reason(
    config: Config,
    launch: Launch,
    status: Callable[[], StreamStatus],
) -> tuple[str | None, ProcessRecord | None]:
    """Why the stream counts as running (None: it does not), and the recorded process."""
    record = read_record(pid_path(config, launch))
    if record is not None and alive(record):
        return f"process {record.pid} started {record.started_at} runs (log {record.log_path})", (
            record
        )
    died = record.pid if record is not None else None
    if config.ha is not None:
        ours = f"{socket.gethostname()}:{died}"
        others = [h for h in lease_holders(config) if h != ours]
        if others:
            return f"{others[0]} holds the leader lease ({len(others)} queued)", record
        return None, record
    current = status()
    if current.state != "running":
        return None, record
    if died is None:
        return f"it committed at {current.heartbeat_at}Z ({current.line()})", record
    # The recorded process died, and its last commit may be this fresh one. A stream that
    # commits again within probe_s is alive (started by someone else); else it is ours, dead.
    deadline = time.monotonic() + launch.probe_s
    while time.monotonic() < deadline:
        time.sleep(min(0.5, launch.probe_s))
        again = status()
        if again.heartbeat_at is not None and again.heartbeat_at != current.heartbeat_at:
            return (
                f"it committed at {again.heartbeat_at}Z, after process {died} started here had"
                f" died ({again.line()})",
                record,
            )
    return None, record


def wait_running(
    config: Config,
    launch: Launch,
    record: ProcessRecord,
    status: Callable[[], StreamStatus],
    since: datetime,
) -> StreamStatus:
    """Until the started stream has committed twice after ``since`` (naive UTC); a LaunchError
    when it exits first or does not within ``launch.timeout_s`` (it is stopped then)."""
    deadline = time.monotonic() + launch.timeout_s
    first: datetime | None = None
    while True:
        code = _exit_code(record)
        if code is not None:
            raise LaunchError(
                f"stream {config.name} exited with code {code} before it ran",
                f"see its log {record.log_path}",
            )
        current = status()
        beat = current.heartbeat_at
        if beat is not None and beat > since:
            if first is not None and beat > first:
                return current
            first = first or beat
        if time.monotonic() >= deadline:
            stop(record)
            raise LaunchError(
                f"stream {config.name} (pid {record.pid}) did not commit within"
                f" {launch.timeout_s:g}s and was stopped",
                f"see its log {record.log_path}",
            )
        time.sleep(launch.poll_s)


def ensure_stream(
    config_path: str,
    config: Config,
    launch: Launch | None = None,
    store: MetadataStore | None = None,
) -> Ensured:
    """Start the stream of ``config_path`` unless it runs; once started, wait until it commits.

    ``config`` is that file's parsed content (the caller may have read it with secrets from
    elsewhere, e.g. an Airflow connection; ``launch.env`` hands those to the process).
    """
    launch = launch or Launch()
    own_store = store is None
    store = store or MetadataStore(config.metadata_url)

    def status() -> StreamStatus:
        return stream_status(config, store, stale_after_s=launch.stale_after_s)

    try:
        reason, previous = running_reason(config, launch, status)
        if reason is not None:
            live = previous if previous is not None and alive(previous) else None
            return Ensured(
                False,
                f"stream {config.name} is running: {reason}",
                pid=live.pid if live else None,
                log_path=live.log_path if live else None,
            )
        since = datetime.now(timezone.utc).replace(tzinfo=None)
        record = start(config_path, config, launch)
        log.info(
            "started stream %s: pid %d, log %s%s",
            config.name,
            record.pid,
            record.log_path,
            f" (process {previous.pid} had died)" if previous is not None else "",
        )
        current = wait_running(config, launch, record, status, since)
        return Ensured(
            True,
            f"started stream {config.name}: pid {record.pid}, log {record.log_path};"
            f" {current.line()}",
            pid=record.pid,
            log_path=record.log_path,
            status=current,
        )
    finally:
        if own_store:
            store.engine.dispose()
