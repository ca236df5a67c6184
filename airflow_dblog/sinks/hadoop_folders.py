"""Folders on Spark's Hadoop file systems (local, ``s3a://``, ...), read from the driver's JVM."""

from __future__ import annotations

import logging
import re
from typing import Any

log = logging.getLogger(__name__)


def remove_unless_holding(spark: Any, folder: str, kept: re.Pattern[str], what: str) -> None:
    """Remove ``folder`` if it exists and none of its names match ``kept``.

    A kill while Spark or Delta creates such a folder leaves temporary or staged files and
    nothing they would read, and they refuse to start on it: without a file that ``kept``
    names, it holds nothing, and they make it again.
    """
    path = spark._jvm.org.apache.hadoop.fs.Path(folder)
    fs = path.getFileSystem(spark._jsc.hadoopConfiguration())
    if not fs.exists(path):
        return
    names = [status.getPath().getName() for status in fs.listStatus(path)]
    if not any(kept.match(name) for name in names):
        log.warning("%s: removing %s (%s)", folder, what, ", ".join(names))
        fs.delete(path, True)


def remove(spark: Any, folder: str) -> None:
    """Remove ``folder`` and everything in it, if it exists."""
    path = spark._jvm.org.apache.hadoop.fs.Path(folder)
    path.getFileSystem(spark._jsc.hadoopConfiguration()).delete(path, True)
