"""Where the spool's segments live: a local directory, or a folder on any Hadoop-compatible or
object store (``s3a://``, ``gs://``, ``abfss://``, ``hdfs://``), seen from the driver.

The driver writes, lists and deletes segments here; Spark reads them back on the executors
through Hadoop's filesystem with the session's settings (no credentials in any task). A segment
must appear whole or not at all: locally it is written to a temporary name, fsynced and linked
into place; on an object store it is one PUT (a completed multipart upload), which is atomic,
so nothing is renamed there.

Object stores go through ``pyarrow.fs`` (already a dependency of the ``[spark]`` extra). S3's
endpoint is ``spark.hadoop.fs.s3a.endpoint`` in ``spark.conf`` or ``DBLOG_S3_ENDPOINT``, as for
Spark; credentials are ``spark.hadoop.fs.s3a.access.key`` / ``secret.key`` in ``spark.conf``, else
``AWS_ACCESS_KEY_ID`` / ``AWS_SECRET_ACCESS_KEY``, else AWS's default chain (profiles, roles).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any, BinaryIO, NamedTuple, Protocol

from airflow_dblog.errors import DblogError

_S3_SCHEMES = ("s3a", "s3n", "s3")
S3_ENDPOINT = "spark.hadoop.fs.s3a.endpoint"  # the spark.conf keys Spark and the spool share
S3_REGION = "spark.hadoop.fs.s3a.endpoint.region"
S3_ACCESS_KEY = "spark.hadoop.fs.s3a.access.key"
S3_SECRET_KEY = "spark.hadoop.fs.s3a.secret.key"
S3_SESSION_TOKEN = "spark.hadoop.fs.s3a.session.token"
_S3_CREDENTIALS = {  # the conf's key: the environment's variable, as Spark reads them for S3A
    S3_ACCESS_KEY: "AWS_ACCESS_KEY_ID",
    S3_SECRET_KEY: "AWS_SECRET_ACCESS_KEY",
    S3_SESSION_TOKEN: "AWS_SESSION_TOKEN",
}


class Entry(NamedTuple):
    name: str
    size: int
    mtime: float  # seconds since the epoch


class SpoolStore(Protocol):
    """A flat folder of immutable files."""

    location: str  # the folder as the user wrote it (a path or a URI)
    write_hint: str  # what to check when a write fails

    def uri(self, name: str) -> str:
        """The file as Spark's filesystem layer names it."""

    def list(self, suffix: str, after: str = "") -> list[Entry]:
        """The files named ``*suffix`` that sort after ``after``."""

    def create(self, name: str, data: bytes) -> None:
        """Write a new file whole or not at all; FileExistsError if it exists, OSError."""

    def read(self, name: str) -> bytes: ...

    def open(self, name: str) -> BinaryIO:
        """The file for random access (a Parquet footer is read from its end)."""

    def exists(self, name: str) -> bool: ...

    def delete(self, name: str) -> None: ...


def is_uri(location: str) -> bool:
    scheme, sep, _ = location.partition("://")
    return bool(sep) and scheme.isidentifier() and scheme.lower() != "file"


def join(location: str, *parts: str) -> str:
    """``location/parts...`` for a local path or a URI alike."""
    if is_uri(location):
        return "/".join([location.rstrip("/"), *parts])
    return str(Path(location.removeprefix("file://")).joinpath(*parts))


def open_store(location: str, conf: Mapping[str, str] | None = None) -> SpoolStore:
    """The store of ``location``; ``conf`` is the stream's ``spark.conf`` (for the endpoint)."""
    return ArrowStore(location, conf or {}) if is_uri(location) else LocalStore(location)


class LocalStore:
    """A local (or mounted) directory: temp file, fsync, link, fsync of the directory."""

    write_hint = "check the checkpoint directory's permissions and disk"

    def __init__(self, location: str) -> None:
        self.location = location
        self.dir = Path(location.removeprefix("file://"))
        self.dir.mkdir(parents=True, exist_ok=True)

    def uri(self, name: str) -> str:
        return (self.dir / name).resolve().as_uri()

    def list(self, suffix: str, after: str = "") -> list[Entry]:
        # a stat only for the names asked for: a follower lists a long backlog several
        # times a second for its few newest files
        out = []
        for name in os.listdir(self.dir):
            if not name.endswith(suffix) or name <= after:
                continue
            try:
                stat = os.stat(self.dir / name)
            except FileNotFoundError:  # deleted meanwhile
                continue
            out.append(Entry(name, stat.st_size, stat.st_mtime))
        return out

    def create(self, name: str, data: bytes) -> None:
        tmp = self.dir / f".{name.partition('.')[0].lstrip('0') or '0'}.{os.getpid()}.tmp"
        try:
            with open(tmp, "wb") as out:
                out.write(data)
                out.flush()
                os.fsync(out.fileno())
            os.link(tmp, self.dir / name)  # link, not replace: never overwrites
        finally:
            tmp.unlink(missing_ok=True)
        fd = os.open(self.dir, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

    def read(self, name: str) -> bytes:
        return (self.dir / name).read_bytes()

    def open(self, name: str) -> BinaryIO:
        return open(self.dir / name, "rb")

    def exists(self, name: str) -> bool:
        return (self.dir / name).exists()

    def delete(self, name: str) -> None:
        (self.dir / name).unlink(missing_ok=True)


class ArrowStore:
    """A folder on an object store or HDFS, through ``pyarrow.fs``."""

    write_hint = (
        "check the object store's endpoint (DBLOG_S3_ENDPOINT or spark.hadoop.fs.s3a.endpoint)"
        " and the credentials in the driver's environment"
    )

    def __init__(self, location: str, conf: Mapping[str, str]) -> None:
        self.location = location.rstrip("/")
        self.fs, self.root = _filesystem(self.location, conf)

    def uri(self, name: str) -> str:
        return f"{self.location}/{name}"

    def _path(self, name: str) -> str:
        return f"{self.root}/{name}"

    def list(self, suffix: str, after: str = "") -> list[Entry]:
        from pyarrow import fs

        try:
            infos = self.fs.get_file_info(fs.FileSelector(self.root, allow_not_found=True))
        except OSError as err:
            raise self._error("cannot list", err) from None
        return [
            Entry(info.base_name, info.size or 0, info.mtime.timestamp() if info.mtime else 0.0)
            for info in infos
            if info.type == fs.FileType.File
            and info.base_name.endswith(suffix)
            and info.base_name > after
        ]

    def create(self, name: str, data: bytes) -> None:
        """One upload: the object exists whole once the stream is closed, never before.

        Object stores have no exclusive create; a second writer is kept out by the stream's
        lease (``ha``) and by the capture's check of the segments it resumes after.
        """
        from pyarrow import fs

        path = self._path(name)
        if self.fs.get_file_info(path).type != fs.FileType.NotFound:
            raise FileExistsError(path)
        with self.fs.open_output_stream(path) as out:
            out.write(data)

    def read(self, name: str) -> bytes:
        try:
            with self.fs.open_input_stream(self._path(name)) as src:
                return bytes(src.read())
        except OSError as err:
            raise self._error(f"cannot read {name} in", err) from None

    def open(self, name: str) -> BinaryIO:
        try:
            source: BinaryIO = self.fs.open_input_file(self._path(name))
            return source
        except OSError as err:
            raise self._error(f"cannot read {name} in", err) from None

    def exists(self, name: str) -> bool:
        from pyarrow import fs

        return bool(self.fs.get_file_info(self._path(name)).type != fs.FileType.NotFound)

    def delete(self, name: str) -> None:
        try:
            self.fs.delete_file(self._path(name))
        except FileNotFoundError:
            pass
        except OSError as err:
            raise self._error(f"cannot delete {name} in", err) from None

    def _error(self, what: str, err: OSError) -> DblogError:
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        return DblogError(f"{what} the spool {self.location}: {first}", self.write_hint)


def _s3_place(conf: Mapping[str, str]) -> dict[str, str]:
    """The store's endpoint and region, from ``conf`` or the environment."""
    endpoint = conf.get(S3_ENDPOINT) or os.environ.get("DBLOG_S3_ENDPOINT")
    region = conf.get(S3_REGION) or os.environ.get("AWS_REGION")
    region = region or os.environ.get("AWS_DEFAULT_REGION")
    return {S3_ENDPOINT: str(endpoint or "").strip(), S3_REGION: str(region or "").strip()}


def _s3_credentials(conf: Mapping[str, str]) -> dict[str, str]:
    """The access key, secret and token of ``conf`` if it names a key, else the environment's
    (a key and the token that goes with it come from one place)."""
    if conf.get(S3_ACCESS_KEY):
        found = {key: str(conf.get(key) or "") for key in _S3_CREDENTIALS}
    else:
        found = {key: os.environ.get(var, "") for key, var in _S3_CREDENTIALS.items()}
    return {key: value.strip() for key, value in found.items() if value.strip()}


def task_conf(conf: Mapping[str, str]) -> dict[str, str]:
    """What a Spark task on another machine needs to open the store as the driver does: the
    S3 endpoint, region and credentials, from ``conf`` or the driver's environment.

    Executors need not have the driver's environment; Spark carries the same settings to them
    in the Hadoop configuration of every task, which a Python task cannot read.
    """
    settings = {**_s3_place(conf), **_s3_credentials(conf)}
    return {key: value for key, value in settings.items() if value}


def arrow_filesystem(location: str, conf: Mapping[str, str]) -> tuple[Any, str]:
    """The pyarrow filesystem of a local path or a URI, and the folder's path in it."""
    from pyarrow import fs

    if not is_uri(location):
        return fs.LocalFileSystem(), str(Path(location.removeprefix("file://")).resolve())
    return _filesystem(location, conf)


def _filesystem(location: str, conf: Mapping[str, str]) -> tuple[Any, str]:
    """The pyarrow filesystem and the folder's path in it."""
    from pyarrow import fs

    scheme, _, rest = location.partition("://")
    if scheme.lower() in _S3_SCHEMES:
        place, credentials = _s3_place(conf), _s3_credentials(conf)
        endpoint, region = place[S3_ENDPOINT], place[S3_REGION]
        options: dict[str, Any] = {}
        if endpoint:
            host = endpoint.split("://", 1)[-1]
            options["endpoint_override"] = host
            options["scheme"] = "http" if endpoint.startswith("http://") else "https"
            options["force_virtual_addressing"] = False
            region = region or "us-east-1"
        if region:
            options["region"] = region
        if S3_ACCESS_KEY in credentials and S3_SECRET_KEY in credentials:
            options["access_key"] = credentials[S3_ACCESS_KEY]
            options["secret_key"] = credentials[S3_SECRET_KEY]
            options["session_token"] = credentials.get(S3_SESSION_TOKEN)
        # else AWS's default chain: profiles, instance and pod roles
        return fs.S3FileSystem(**options), rest.rstrip("/")
    try:
        filesystem, path = fs.FileSystem.from_uri(location)
    except (OSError, ValueError) as err:
        raise DblogError(
            f"cannot open the checkpoint {location} from the driver: {err}",
            "use s3a://, gs://, abfss://, hdfs:// or a local path (hdfs:// needs libhdfs and"
            " HADOOP_HOME on the driver)",
        ) from None
    return filesystem, path.rstrip("/")
