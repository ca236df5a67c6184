"""Follow-up dumps of the keys a range chunk found the lake holding and the source lacking.

A range chunk's rows say which keys the source had in its range; the keys Delta holds live in
that range, last changed before the chunk's window began, and absent from its rows are keys
the source lost without the log saying so. Delta does not delete them itself: Kafka's
forwarder is ahead of Delta, and a delete decided there could land in Kafka after a later
re-insert of the key. Instead Delta's batch asks for a key-list dump of them; its chunks read
each key again inside a watermark window and delete, in log order in every sink, those the
source still lacks (the ``absent`` keys of a key-list chunk).

The request names the dump and the chunks it repairs (``requested_by``), and names each chunk
at most once: a batch replayed after a crash, or cut differently, finds its chunks named and
asks for nothing twice.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator, Sequence

REQUESTED_BY_MAX = 256  # dblog_dumps.requested_by
_TAG = re.compile(r"^dblog repair of dump (\d+), chunks ([0-9,-]+): ")
EXTRA_KEYS = "keys the lake held that the source lacked"
DIFFERENCES = "differences a verify found"


def id_ranges(ids: Iterable[int]) -> str:
    """Chunk ids as short text: runs of consecutive ids as ``first-last``, comma-separated."""
    out: list[str] = []
    run: list[int] = []
    for i in sorted(set(ids)):
        if run and i == run[-1] + 1:
            run.append(i)
            continue
        if run:
            out.append(_run(run))
        run = [i]
    if run:
        out.append(_run(run))
    return ",".join(out)


def _run(run: Sequence[int]) -> str:
    return str(run[0]) if len(run) == 1 else f"{run[0]}-{run[-1]}"


def parse_ranges(text: str) -> set[int]:
    """The ids :func:`id_ranges` wrote."""
    ids: set[int] = set()
    for part in filter(None, text.split(",")):
        first, _, last = part.partition("-")
        ids.update(range(int(first), int(last or first) + 1))
    return ids


def requested_by(dump_id: int, chunk_ids: Iterable[int], reason: str = EXTRA_KEYS) -> str:
    """The follow-up dump's ``requested_by``: the dump and the chunks whose keys it re-reads."""
    return f"dblog repair of dump {dump_id}, chunks {id_ranges(chunk_ids)}: {reason}"


def repaired_chunks(text: str, dump_id: int) -> set[int]:
    """The chunks of ``dump_id`` a dump requested by ``text`` repairs (none if it is no repair
    of that dump)."""
    m = _TAG.match(text or "")
    if m is None or int(m.group(1)) != dump_id:
        return set()
    return parse_ranges(m.group(2))


def groups(dump_id: int, chunk_ids: Iterable[int], reason: str = EXTRA_KEYS) -> Iterator[list[int]]:
    """``chunk_ids`` split so that each group's :func:`requested_by` fits the column (one
    group unless the ids are scattered)."""
    group: list[int] = []
    for i in sorted(set(chunk_ids)):
        if group and len(requested_by(dump_id, [*group, i], reason)) > REQUESTED_BY_MAX:
            yield group
            group = []
        group.append(i)
    if group:
        yield group
