"""Source positions: totally ordered per source, serialised as strings that sort the same way.

A log event's position is the source's native coordinates followed by ``0``; a dumped row is
placed right after its chunk's high watermark: the watermark's coordinates followed by
``1 + row index``. Comparing tuples (or the strings) therefore orders dumped rows after the
watermark event and before anything the log produces later.

MySQL/MariaDB: (lineage epoch << 32 | binlog file index, event offset, row index in event, sub)
PostgreSQL:    (commit LSN, change index in transaction, sub)

The lineage epoch grows when the stream continues on another binlog history (a promoted replica,
a RESET MASTER), whose file numbers may be lower: every position of the new history sorts after
every position of the old one. It is 0 until then, so older positions keep their text.
"""

from __future__ import annotations

from dataclasses import dataclass

_WIDTH = 20  # digits of a 64-bit unsigned integer
EPOCH_SHIFT = 32  # binlog file indices stay below 2**32 (MySQL numbers them up to 999,999+)
_ARITY: dict[str, int] = {"mysql": 4, "postgres": 3}


@dataclass(frozen=True, order=True)
class Position:
    """A point in one source's change stream; ``order=True`` compares the coordinates."""

    coords: tuple[int, ...]

    @classmethod
    def mysql(
        cls, file_index: int, offset: int, row: int = 0, sub: int = 0, *, epoch: int = 0
    ) -> Position:
        return cls((epoch << EPOCH_SHIFT | file_index, offset, row, sub))

    @property
    def epoch(self) -> int:
        """MySQL/MariaDB: the lineage epoch of the binlog history this position belongs to."""
        return self.coords[0] >> EPOCH_SHIFT

    @property
    def binlog_file_index(self) -> int:
        """MySQL/MariaDB: the binlog file number, without the lineage epoch."""
        return self.coords[0] & ((1 << EPOCH_SHIFT) - 1)

    @classmethod
    def postgres(cls, lsn: int, change: int = 0, sub: int = 0) -> Position:
        return cls((lsn, change, sub))

    def dumped_row(self, index: int) -> Position:
        """The position of the ``index``-th row a chunk emits at this (high watermark) position."""
        return Position((*self.coords[:-1], 1 + index))

    def log_part(self) -> tuple[int, ...]:
        """The coordinates without the dumped-row suffix: where the log itself stands."""
        return self.coords[:-1]

    def __str__(self) -> str:
        return "-".join([f"{c:0{_WIDTH}d}" for c in self.coords])

    @classmethod
    def parse(cls, text: str) -> Position:
        try:
            coords = tuple(int(part) for part in text.split("-"))
        except ValueError:
            raise ValueError(f"not a dblog position: {text!r}") from None
        if len(coords) not in _ARITY.values() or min(coords) < 0:
            raise ValueError(f"not a dblog position: {text!r}")
        return cls(coords)


def lsn_to_int(lsn: str) -> int:
    """PostgreSQL's ``XXXXXXXX/XXXXXXXX`` text form to the 64-bit integer it stands for."""
    high, _, low = lsn.partition("/")
    return (int(high, 16) << 32) | int(low, 16)


def int_to_lsn(value: int) -> str:
    return f"{value >> 32:X}/{value & 0xFFFFFFFF:X}"


def binlog_file_index(name: str) -> int:
    """``mysql-bin.000042`` -> 42: binlog files are numbered in the order they are written."""
    suffix = name.rsplit(".", 1)[-1]
    if not suffix.isdigit():
        raise ValueError(f"not a binlog file name: {name!r}")
    return int(suffix)
