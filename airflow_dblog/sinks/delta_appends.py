"""Appends to a Delta table under an idempotent-write id, without Delta's state rebuild.

Delta's writer, given ``txnAppId``/``txnVersion``, finds the app's last version in the table
snapshot's computed state: a few Spark jobs over every commit since the last checkpoint, on
every append, however small. The same versions are in the snapshot's checksum (the ``.crc``
Delta writes beside each commit, or keeps in memory after its own), so :func:`append_once`
reads them there and commits through Delta's transaction API. The transaction still records
that it read the app id, as Delta's own lookup does: a concurrent commit under the same id (a
new leader's fence) fails it with Delta's conflict check. Without a checksum holding the
versions (a table another writer left without one) Delta's own lookup answers.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

# DeltaOperations.Write's arguments after the save mode, all optional (Delta 4.4)
_WRITE_OPTIONS = 8


def append_once(spark: SparkSession, path: str, rows: DataFrame, app_id: str, version: int) -> bool:
    """Append ``rows`` to the Delta table at ``path`` as write ``version`` of ``app_id``, in
    one commit that records it, unless the table holds that version of the app or a later
    one; whether it committed. Raises Delta's ``ConcurrentTransactionException`` if a commit
    under ``app_id`` landed after this one read the table."""
    jvm: Any = spark._jvm
    delta = jvm.org.apache.spark.sql.delta
    txn = delta.DeltaLog.forTable(spark._jsparkSession, path).startTransaction()
    if app_version(txn, app_id) >= version:
        return False
    files = txn.writeFiles(rows._jdf)
    now = jvm.scala.Some(jvm.java.lang.Long.valueOf(int(time.time() * 1000)))
    txn.updateSetTransaction(app_id, version, now)
    none = [jvm.scala.Option.empty() for _ in range(_WRITE_OPTIONS)]
    txn.commit(files, delta.DeltaOperations.Write(jvm.org.apache.spark.sql.SaveMode.Append, *none))
    return True


def app_version(txn: Any, app_id: str) -> int:
    """The last version of ``app_id`` the transaction's snapshot holds (-1: none), noted as
    read by the transaction."""
    checksum = txn.snapshot().checksumOpt()
    versions = checksum.get().setTransactions() if checksum.isDefined() else None
    if versions is None or not versions.isDefined():
        return int(txn.txnVersion(app_id))
    txn.readTxn().addOne(app_id)  # what Delta's txnVersion notes: the conflict check reads it
    found = versions.get().iterator()
    latest = -1
    while found.hasNext():
        entry = found.next()
        if entry.appId() == app_id:
            latest = max(latest, int(entry.version()))
    return latest
