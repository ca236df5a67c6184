"""What a verify dump found: per chunk, then summed per dump.

A verify dump runs the same chunks as a dump, but the lake compares each chunk's rows (as of its
window, minus the keys the log changed inside it) with what it holds instead of writing them. A
chunk's verdict is recorded once; a dump's report is the sum of its chunks' verdicts, with a few
example keys per table so that a person can look at the rows.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

EXAMPLES_PER_CHUNK = 5
EXAMPLES_PER_TABLE = 10
FOUND = ("missing", "extra", "different")  # what an example key was found to be


@dataclass(frozen=True)
class ChunkVerdict:
    """One chunk's comparison. ``checked``: rows the source had that were compared (those the
    log changed inside the window are the log's word, not compared); ``missing``: keys the lake
    lacks or holds deleted; ``extra``: keys the lake holds live in the chunk's range that the
    source lacked (None: not looked for, the key has no order the lake and the source agree
    on); ``different``: keys both hold with other values; ``repaired``: the differences handed
    to a follow-up dump that reads them again and writes them (0 in a dry run)."""

    checked: int
    missing: int = 0
    extra: int | None = 0
    different: int = 0
    repaired: int = 0
    examples: tuple[tuple[str, tuple[Any, ...]], ...] = ()  # (found, key)

    @property
    def differences(self) -> int:
        return self.missing + (self.extra or 0) + self.different

    def as_record(self) -> dict[str, Any]:
        return {
            "checked": self.checked,
            "missing": self.missing,
            "extra": self.extra,
            "different": self.different,
            "repaired": self.repaired,
            "examples": [[found, list(key)] for found, key in self.examples],
        }

    @classmethod
    def from_record(cls, record: Mapping[str, Any]) -> ChunkVerdict:
        examples = tuple((found, tuple(key)) for found, key in record.get("examples", ()))
        return cls(
            record["checked"],
            record["missing"],
            record["extra"],
            record["different"],
            record["repaired"],
            examples,
        )


def verdict(
    checked: int,
    found: Mapping[str, list[list[Any]] | None],
    extra_checked: bool,
    repair: bool,
) -> ChunkVerdict:
    """A chunk's verdict from the keys the lake found in each class of :data:`FOUND`."""
    examples: list[tuple[str, tuple[Any, ...]]] = []
    for kind in FOUND:
        for key in found.get(kind) or ():
            if len(examples) == EXAMPLES_PER_CHUNK:
                break
            examples.append((kind, tuple(key)))
    counts = {kind: len(found.get(kind) or ()) for kind in FOUND}
    differences = sum(counts.values())
    return ChunkVerdict(
        checked,
        counts["missing"],
        counts["extra"] if extra_checked else None,
        counts["different"],
        differences if repair else 0,
        tuple(examples),
    )


@dataclass
class VerifyReport:
    """A verify dump's counts so far, summed over its compared chunks."""

    mode: str
    chunks: int = 0
    checked: int = 0
    missing: int = 0
    extra: int = 0
    different: int = 0
    repaired: int = 0
    # tables whose extras were not sought (a table whose key order only the source knows is
    # swept once, by its last chunk: until then it is listed here)
    extra_unchecked: set[str] = field(default_factory=set)
    examples: dict[str, list[dict[str, Any]]] = field(default_factory=dict)

    @classmethod
    def of(cls, mode: str, verdicts: Iterable[tuple[str, ChunkVerdict]]) -> VerifyReport:
        report = cls(mode)
        checked: set[str] = set()
        for table, v in verdicts:
            report.chunks += 1
            report.checked += v.checked
            report.missing += v.missing
            report.different += v.different
            report.repaired += v.repaired
            if v.extra is None:
                report.extra_unchecked.add(table)
            else:
                report.extra += v.extra
                checked.add(table)
            shown = report.examples.setdefault(table, [])
            for found, key in v.examples:
                if len(shown) < EXAMPLES_PER_TABLE:
                    shown.append({"found": found, "key": list(key)})
        report.extra_unchecked -= checked
        return report

    @property
    def differences(self) -> int:
        return self.missing + self.extra + self.different

    def as_dict(self) -> dict[str, Any]:
        return {
            "mode": self.mode,
            "chunks_compared": self.chunks,
            "checked": self.checked,
            "missing": self.missing,
            "extra": self.extra,
            "different": self.different,
            "repaired": self.repaired,
            "extra_not_checked": sorted(self.extra_unchecked),
            "examples": {t: e for t, e in sorted(self.examples.items()) if e},
        }

    def examples_line(self) -> str:
        """The example keys in one line, by table: ``db.t: missing [4], different [7]``."""
        return "; ".join(
            f"{table}: " + ", ".join(f"{e['found']} {json.dumps(e['key'])}" for e in examples)
            for table, examples in sorted(self.examples.items())
            if examples
        )

    def line(self) -> str:
        """The counts in one line (task logs, ``dblog status``)."""
        unchecked = (
            f" (extra not checked in {', '.join(sorted(self.extra_unchecked))})"
            if self.extra_unchecked
            else ""
        )
        return (
            f"verify ({self.mode}): {self.checked} rows checked, {self.missing} missing in the"
            f" lake, {self.extra} extra{unchecked}, {self.different} different,"
            f" {self.repaired} repaired"
        )
