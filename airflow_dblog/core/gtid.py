"""GTID sets of MySQL and MariaDB behind one small interface.

The ``gtid`` watermark strategy reads the server's executed GTID set before and after a chunk
SELECT and asks, for every change event, whether its GTID was already in a set. MySQL and
MariaDB spell and mean GTIDs differently:

- MySQL: ``uuid:1-5:7,uuid2:3`` (8.3+ also ``uuid:tag:1-3``). A set is exact: interval lists per
  source server (and tag); a GTID is in the set iff its number is in one of the intervals.
- MariaDB: ``domain-server-seq`` per replication domain (``0-1-100,1-2-5``), as in
  ``@@gtid_binlog_pos``. It is a position, not a set: a GTID is "in" it iff its sequence number
  is at most the one recorded for its domain (sequence numbers only grow within a domain).

Both are immutable values; operations return new sets. :func:`parse_gtid_set` reads either.
"""

from __future__ import annotations

import re
from abc import ABC, abstractmethod
from bisect import bisect_right
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import ClassVar, Literal

Flavor = Literal["mysql", "mariadb"]

_UUID = re.compile(r"^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$")
_TAG = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,31}$")
_INTERVAL = re.compile(r"^(\d+)(?:-(\d+))?$")
_MAX_GNO = 2**63 - 1  # MySQL's largest transaction number
_MAX_U32 = 2**32 - 1
_MAX_U64 = 2**64 - 1

Interval = tuple[int, int]  # inclusive


class GtidSet(ABC):
    """What a window needs from an executed-GTID set, whichever server wrote it."""

    flavor: ClassVar[Flavor]

    @abstractmethod
    def contains(self, gtid: str) -> bool:
        """Whether the transaction ``gtid`` is part of this set (had committed when it was read)."""

    @abstractmethod
    def issubset(self, other: GtidSet) -> bool: ...

    @abstractmethod
    def union(self, other: GtidSet) -> GtidSet: ...

    @abstractmethod
    def add(self, gtid: str) -> GtidSet:
        """This set plus one transaction, as a new set."""

    @abstractmethod
    def is_empty(self) -> bool: ...

    @abstractmethod
    def __str__(self) -> str:
        """The server's own notation, normalised, so ``parse(str(s)) == s``."""

    def __contains__(self, gtid: object) -> bool:
        return isinstance(gtid, str) and self.contains(gtid)

    def __bool__(self) -> bool:
        return not self.is_empty()

    def __le__(self, other: GtidSet) -> bool:
        return self.issubset(other)

    def __or__(self, other: GtidSet) -> GtidSet:
        return self.union(other)

    def _same_flavor(self, other: GtidSet) -> bool:
        if other.flavor == self.flavor:
            return True
        if self.is_empty() or other.is_empty():
            return False
        raise TypeError(f"cannot combine a {self.flavor} GTID set with a {other.flavor} one")


def parse_gtid_set(text: str, flavor: Flavor | None = None) -> GtidSet:
    """Read a GTID set in MySQL or MariaDB notation; ``flavor=None`` tells them apart.

    The empty string is the empty set (a fresh server); without a flavor it is a MySQL one,
    which behaves the same for :meth:`GtidSet.contains`.
    """
    if flavor == "mysql":
        return MysqlGtidSet.parse(text)
    if flavor == "mariadb":
        return MariadbGtidSet.parse(text)
    if flavor is not None:
        raise ValueError(f"unknown GTID flavor {flavor!r}: use 'mysql' or 'mariadb'")
    stripped = text.strip()
    if not stripped or ":" in stripped:
        return MysqlGtidSet.parse(text)
    return MariadbGtidSet.parse(text)


# --------------------------------------------------------------------------------------- MySQL


def _normalise(intervals: Iterable[Interval]) -> tuple[Interval, ...]:
    """Sorted, disjoint and non-adjacent: ``1-3`` and ``4-5`` become ``1-5``."""
    out: list[list[int]] = []
    for start, end in sorted(intervals):
        if out and start <= out[-1][1] + 1:
            out[-1][1] = max(out[-1][1], end)
        else:
            out.append([start, end])
    return tuple((s, e) for s, e in out)


def _subtract(a: tuple[Interval, ...], b: tuple[Interval, ...]) -> tuple[Interval, ...]:
    out: list[Interval] = []
    j = 0
    for start, end in a:
        cur = start
        while j < len(b) and b[j][1] < cur:
            j += 1
        k = j
        while k < len(b) and b[k][0] <= end:
            if b[k][0] > cur:
                out.append((cur, b[k][0] - 1))
            cur = max(cur, b[k][1] + 1)
            if cur > end:
                break
            k += 1
        if cur <= end:
            out.append((cur, end))
    return tuple(out)


def _within(intervals: tuple[Interval, ...], gno: int) -> bool:
    i = bisect_right(intervals, (gno, _MAX_GNO + 1)) - 1
    return i >= 0 and intervals[i][0] <= gno <= intervals[i][1]


def _parse_interval(part: str, where: str) -> Interval:
    m = _INTERVAL.match(part)
    if not m:
        raise ValueError(f"bad GTID interval {part!r} in {where!r}: expected N or N-M")
    start = int(m.group(1))
    end = int(m.group(2)) if m.group(2) is not None else start
    if start < 1 or end > _MAX_GNO:
        raise ValueError(f"GTID interval {part!r} in {where!r} is outside 1..{_MAX_GNO}")
    if end < start:
        raise ValueError(f"GTID interval {part!r} in {where!r} ends before it starts")
    return start, end


def _parse_uuid(text: str, where: str) -> str:
    if not _UUID.match(text):
        raise ValueError(f"bad server UUID {text!r} in GTID {where!r}")
    return text.lower()


def parse_mysql_gtid(gtid: str) -> tuple[str, str, int]:
    """``uuid:N`` or ``uuid:tag:N`` as ``(uuid, tag, N)``; the tag is ``""`` when untagged."""
    parts = gtid.strip().split(":")
    if len(parts) not in (2, 3):
        raise ValueError(f"bad MySQL GTID {gtid!r}: expected uuid:N or uuid:tag:N")
    uuid = _parse_uuid(parts[0], gtid)
    tag = ""
    if len(parts) == 3:
        if not _TAG.match(parts[1]):
            raise ValueError(f"bad GTID tag {parts[1]!r} in {gtid!r}")
        tag = parts[1].lower()
    if not parts[-1].isdigit():
        raise ValueError(f"bad MySQL GTID {gtid!r}: the transaction number is not a number")
    gno = int(parts[-1])
    if not 1 <= gno <= _MAX_GNO:
        raise ValueError(f"MySQL GTID {gtid!r} has a transaction number outside 1..{_MAX_GNO}")
    return uuid, tag, gno


@dataclass(frozen=True)
class MysqlGtidSet(GtidSet):
    """``{(server uuid, tag): intervals}`` kept normalised so equal sets compare equal."""

    flavor: ClassVar[Flavor] = "mysql"
    entries: tuple[tuple[tuple[str, str], tuple[Interval, ...]], ...] = ()

    @classmethod
    def from_intervals(
        cls, mapping: Mapping[tuple[str, str] | str, Iterable[Interval]]
    ) -> MysqlGtidSet:
        """Build from ``{uuid or (uuid, tag): [(start, end), ...]}``; intervals are inclusive."""
        merged: dict[tuple[str, str], list[Interval]] = {}
        for sid, intervals in mapping.items():
            uuid, tag = (sid, "") if isinstance(sid, str) else sid
            uuid = _parse_uuid(uuid, str(sid))
            if tag and not _TAG.match(tag):
                raise ValueError(f"bad GTID tag {tag!r}")
            for start, end in intervals:
                if not (1 <= start <= end <= _MAX_GNO):
                    raise ValueError(f"bad GTID interval {start}-{end} for {uuid}")
                merged.setdefault((uuid, tag.lower()), []).append((start, end))
        return cls._build(merged)

    @classmethod
    def _build(cls, merged: Mapping[tuple[str, str], Iterable[Interval]]) -> MysqlGtidSet:
        entries = []
        for sid in sorted(merged):
            intervals = _normalise(merged[sid])
            if intervals:
                entries.append((sid, intervals))
        return cls(tuple(entries))

    @classmethod
    def parse(cls, text: str) -> MysqlGtidSet:
        """``@@gtid_executed`` text (commas, optional newlines) to a normalised set."""
        merged: dict[tuple[str, str], list[Interval]] = {}
        if not text.strip():
            return cls()
        for element in text.split(","):
            element = element.strip()
            if not element:
                raise ValueError(f"empty element in GTID set {text!r}")
            parts = [p.strip() for p in element.split(":")]
            uuid = _parse_uuid(parts[0], element)
            tag, pending = "", True  # pending: the current (uuid, tag) has no interval yet
            for part in parts[1:]:
                if _INTERVAL.match(part):
                    merged.setdefault((uuid, tag), []).append(_parse_interval(part, element))
                    pending = False
                elif _TAG.match(part):
                    if pending and tag:
                        raise ValueError(f"GTID tag {tag!r} in {element!r} has no interval")
                    tag, pending = part.lower(), True
                else:
                    raise ValueError(f"bad GTID interval {part!r} in {element!r}")
            if pending:
                what = f"tag {tag!r}" if tag else f"server {uuid}"
                raise ValueError(f"GTID {what} in {element!r} has no interval")
        return cls._build(merged)

    def _map(self) -> dict[tuple[str, str], tuple[Interval, ...]]:
        return dict(self.entries)

    def intervals(self, uuid: str, tag: str = "") -> tuple[Interval, ...]:
        return self._map().get((uuid.lower(), tag.lower()), ())

    def contains(self, gtid: str) -> bool:
        uuid, tag, gno = parse_mysql_gtid(gtid)
        return _within(self.intervals(uuid, tag), gno)

    def issubset(self, other: GtidSet) -> bool:
        if not self._same_flavor(other):
            return self.is_empty()
        assert isinstance(other, MysqlGtidSet)
        theirs = other._map()
        return all(not _subtract(iv, theirs.get(sid, ())) for sid, iv in self.entries)

    def union(self, other: GtidSet) -> GtidSet:
        if not self._same_flavor(other):
            return other if self.is_empty() else self
        assert isinstance(other, MysqlGtidSet)
        merged: dict[tuple[str, str], list[Interval]] = {}
        for sid, intervals in (*self.entries, *other.entries):
            merged.setdefault(sid, []).extend(intervals)
        return self._build(merged)

    def subtract(self, other: GtidSet) -> MysqlGtidSet:
        """The transactions in this set and not in ``other`` (intervals are split as needed)."""
        if not self._same_flavor(other):
            return self
        assert isinstance(other, MysqlGtidSet)
        theirs = other._map()
        return self._build({sid: _subtract(iv, theirs.get(sid, ())) for sid, iv in self.entries})

    def add(self, gtid: str) -> MysqlGtidSet:
        uuid, tag, gno = parse_mysql_gtid(gtid)
        merged = {sid: list(iv) for sid, iv in self.entries}
        merged.setdefault((uuid, tag), []).append((gno, gno))
        return self._build(merged)

    def count(self) -> int:
        """How many transactions the set holds."""
        return sum(e - s + 1 for _, intervals in self.entries for s, e in intervals)

    def is_empty(self) -> bool:
        return not self.entries

    def __str__(self) -> str:
        by_uuid: dict[str, list[str]] = {}
        for (uuid, tag), intervals in self.entries:  # sorted: untagged ("") before tags
            parts = by_uuid.setdefault(uuid, [uuid])
            if tag:
                parts.append(tag)
            parts.extend(f"{s}" if s == e else f"{s}-{e}" for s, e in intervals)
        return ",".join(":".join(parts) for parts in by_uuid.values())


# ------------------------------------------------------------------------------------- MariaDB


def parse_mariadb_gtid(gtid: str) -> tuple[int, int, int]:
    """``domain-server-seq`` as three integers."""
    parts = gtid.strip().split("-")
    if len(parts) != 3 or not all(p.isdigit() for p in parts):
        raise ValueError(f"bad MariaDB GTID {gtid!r}: expected domain-server-seq")
    domain, server, seq = (int(p) for p in parts)
    if domain > _MAX_U32 or server > _MAX_U32 or seq > _MAX_U64:
        raise ValueError(f"MariaDB GTID {gtid!r} is out of range")
    return domain, server, seq


@dataclass(frozen=True)
class MariadbGtidSet(GtidSet):
    """One ``(domain, server, seq)`` per domain: the last transaction seen in that domain.

    When the text names a domain twice (``@@gtid_binlog_state`` lists one entry per server),
    the entry with the highest sequence number wins: it is the domain's position.
    """

    flavor: ClassVar[Flavor] = "mariadb"
    positions: tuple[tuple[int, int, int], ...] = ()

    @classmethod
    def _build(cls, items: Iterable[tuple[int, int, int]]) -> MariadbGtidSet:
        best: dict[int, tuple[int, int, int]] = {}
        for item in items:
            if item[0] not in best or item[2] > best[item[0]][2]:
                best[item[0]] = item
        return cls(tuple(best[d] for d in sorted(best)))

    @classmethod
    def parse(cls, text: str) -> MariadbGtidSet:
        if not text.strip():
            return cls()
        items = []
        for element in text.split(","):
            if not element.strip():
                raise ValueError(f"empty element in MariaDB GTID position {text!r}")
            items.append(parse_mariadb_gtid(element))
        return cls._build(items)

    def seq(self, domain: int) -> int | None:
        for d, _, s in self.positions:
            if d == domain:
                return s
        return None

    def contains(self, gtid: str) -> bool:
        domain, _, seq = parse_mariadb_gtid(gtid)
        mine = self.seq(domain)
        return mine is not None and seq <= mine

    def issubset(self, other: GtidSet) -> bool:
        if not self._same_flavor(other):
            return self.is_empty()
        assert isinstance(other, MariadbGtidSet)
        for domain, _, seq in self.positions:
            theirs = other.seq(domain)
            if theirs is None or seq > theirs:
                return False
        return True

    def union(self, other: GtidSet) -> GtidSet:
        if not self._same_flavor(other):
            return other if self.is_empty() else self
        assert isinstance(other, MariadbGtidSet)
        return self._build((*self.positions, *other.positions))

    def add(self, gtid: str) -> MariadbGtidSet:
        return self._build((*self.positions, parse_mariadb_gtid(gtid)))

    def is_empty(self) -> bool:
        return not self.positions

    def __str__(self) -> str:
        return ",".join(f"{d}-{s}-{q}" for d, s, q in self.positions)
