"""The barrier the sinks meet at: a spool segment is committed for the stream once every sink
holds it, and deleted once no sink can replay it.

Each sink follows the spool on its own (Kafka does not wait for Delta's MERGE), so the sinks
reach a segment at different times. A segment's footer (reader offset, chunks it
closed) is committed to the stream, and the source may free the log behind it, only once every
sink holds it; a segment is deleted only once no sink can replay it (each replays at most its
current batch, from that batch's first segment).

Delta reports a batch before its Spark commit, so a crash in between replays and reports it
again; Kafka reports after its transaction, and a restarted forwarder first reports the segments
its marker covers: no footer is lost.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import Any

Footer = dict[str, Any]


class SinkBarrier:
    """Which spool segments every sink holds. Thread-safe: each sink's query calls :meth:`held`
    from its own thread."""

    def __init__(
        self,
        sinks: Sequence[str],
        commit: Callable[[list[Footer]], None],
        trim: Callable[[int], Any],
    ) -> None:
        """``commit(footers)`` records segments every sink holds, in order; ``trim(seq)``
        deletes the segments below ``seq``."""
        self._commit, self._trim = commit, trim
        self._held = dict.fromkeys(sinks, -1)  # the last segment each sink holds
        self._replay_from = dict.fromkeys(sinks, 0)  # each sink's current batch starts here
        self._footers: dict[int, Footer] = {}  # segments some sink holds but not every one
        # segments below this are trimmed: a trim lists the spool, which holds a slow sink's
        # whole backlog, so the fast sink's every batch does not list it again for nothing
        self._trimmed_below = 0
        self._lock = threading.Lock()

    def held(self, sink: str, footers: Sequence[Footer]) -> list[Footer]:
        """``sink`` holds the batch with these footers; returns the footers now committed."""
        if not footers:
            return []
        seqs = [f["seq"] for f in footers]
        with self._lock:
            for footer in footers:
                self._footers[footer["seq"]] = footer
            self._held[sink] = max(self._held[sink], max(seqs))
            self._replay_from[sink] = min(seqs)
            everywhere = min(self._held.values())
            ready = [self._footers.pop(s) for s in sorted(self._footers) if s <= everywhere]
            # committed under the lock: the stream's offset only moves forward
            if ready:
                self._commit(ready)
            trim_below = min(self._replay_from.values())
            if trim_below <= self._trimmed_below:
                return ready
        self._trim(trim_below)
        with self._lock:
            self._trimmed_below = max(self._trimmed_below, trim_below)
        return ready
