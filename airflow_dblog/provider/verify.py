"""Verify dumps from Airflow: the operator's options as a mode, a verify dump's report held against
the sensor's threshold, and the repair dumps that follow it, followed as one dump.

A verify dump writes nothing itself. In repair mode each chunk's differences go to a key-list
follow-up dump whose ``requested_by`` names the verify dump (``engine/repairs.py``); the stream
requests it before the chunk completes, so once the verify dump is done its follow-ups are all
known, and the lake agrees with the source once they are done too. Only then has anything been
written, so only then are there Asset events to emit; a dry run writes nothing at all.

Plain Python over the metadata store, shared by the operator, the sensor (poking from a worker)
and the trigger (in the triggerer).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from airflow_dblog.core.verify import VerifyReport
from airflow_dblog.engine.metadata import MetadataStore
from airflow_dblog.engine.metadata.dumps import DumpProgress
from airflow_dblog.engine.repairs import repaired_chunks
from airflow_dblog.errors import DblogError, InputError

# a failed or cancelled repair decides at once; else the least advanced state is the whole's
_STATE_ORDER = ("failed", "cancelled", "running", "paused", "pending")
_TRUE, _FALSE = ("true", "1", "yes", "on"), ("false", "0", "no", "off", "", "none")


class LakeDiffers(DblogError):
    """A verify dump found more differences between the source and the lake than allowed."""


def flag(value: bool | str | None, name: str) -> bool:
    """A boolean option that may arrive as rendered template text (``"True"``)."""
    if isinstance(value, bool) or value is None:
        return bool(value)
    text = str(value).strip().lower()
    if text in _TRUE or text in _FALSE:
        return text in _TRUE
    raise InputError(
        f"{name}={value!r} is neither true nor false",
        "pass a boolean, or a template that renders True or False",
    )


def limit(value: int | str | None, name: str) -> int | None:
    """A count option that may arrive as rendered template text; None (or nothing): no limit."""
    if value is None or isinstance(value, int):
        return value
    text = str(value).strip()
    if text in ("", "None"):
        return None
    try:
        return int(text)
    except ValueError:
        raise InputError(
            f"{name}={value!r} is not a whole number",
            "give a number of rows, or None for no limit",
        ) from None


def verify_mode(verify: bool | str | None, dry_run: bool | str | None) -> str | None:
    """The planner's ``verify`` for the operators' two options: None for an ordinary dump."""
    if not flag(verify, "verify"):
        if flag(dry_run, "dry_run"):
            raise InputError(
                "dry_run=True without verify=True: an ordinary dump writes, it has no dry run",
                "set verify=True to compare the lake with the source without writing",
            )
        return None
    return "dry-run" if flag(dry_run, "dry_run") else "repair"


def repair_dump_ids(store: MetadataStore, dump_id: int) -> list[int]:
    """The follow-up dumps that write what verify dump ``dump_id`` found; all of them once it is
    done, since the stream requests each before the chunk that found its keys completes."""
    stream = store.dump(dump_id).stream
    return [
        d.id
        for d in store.dumps(stream)
        if d.id > dump_id and repaired_chunks(d.requested_by, dump_id)
    ]


@dataclass(frozen=True)
class RepairsProgress:
    """The repair dumps of verify dump ``dump_id`` seen as one dump: the fields of a
    :class:`DumpProgress` the sensor and the trigger read, so that both wait on the repairs
    exactly as they wait on a dump (stall detection included)."""

    dump_id: int
    repairs: tuple[DumpProgress, ...]

    @property
    def state(self) -> str:
        states = {r.state for r in self.repairs}
        return next((s for s in _STATE_ORDER if s in states), "done")

    @property
    def reason(self) -> str | None:
        ended = [r for r in self.repairs if r.state in ("failed", "cancelled")]
        if not ended:
            return None
        return f"dump {ended[0].dump_id} {ended[0].state}: {ended[0].reason}"

    @property
    def chunks_done(self) -> int:
        return sum(r.chunks_done for r in self.repairs)

    @property
    def chunks_total(self) -> int:
        return sum(r.chunks_total for r in self.repairs)

    @property
    def rows_selected(self) -> int:
        return sum(r.rows_selected for r in self.repairs)

    @property
    def rows_emitted(self) -> int:
        return sum(r.rows_emitted for r in self.repairs)

    @property
    def rows_dropped(self) -> int:
        return sum(r.rows_dropped for r in self.repairs)

    def line(self) -> str:
        """The task log's line: how many repairs are done, then each open one's own line."""
        done = sum(r.state == "done" for r in self.repairs)
        head = (
            f"repairs of dump {self.dump_id}: {done}/{len(self.repairs)} dumps done,"
            f" rows emitted {self.rows_emitted}"
        )
        open_ = [r.line() for r in self.repairs if r.state != "done"]
        return "; ".join([head, *open_])


def repairs_progress(
    store: MetadataStore, dump_id: int, repair_ids: Sequence[int]
) -> RepairsProgress:
    return RepairsProgress(dump_id, tuple(store.progress(i) for i in repair_ids))


def check_differences(
    dump_id: int,
    report: VerifyReport,
    max_differences: int | None,
    repair_ids: Sequence[int] = (),
) -> None:
    """Fail a verify dump whose differences exceed ``max_differences`` (None: no limit), with
    the counts and example keys: the line a person starts looking from."""
    if max_differences is None or report.differences <= max_differences:
        return
    examples = report.examples_line()
    problem = (
        f"verify dump {dump_id} found {report.differences} differences, more than"
        f" max_differences={max_differences}: {report.line()}"
        + (f"; examples {examples}" if examples else "")
    )
    look = f"look at the rows of the example keys (dblog status -c FILE --dump {dump_id})"
    if report.mode == "dry-run":
        fix = f"{look}, then repair them: verify again without dry_run"
    elif repair_ids:
        ids = ", ".join(map(str, repair_ids))
        fix = f"dumps {ids} write them again; {look} for what made the lake drift"
    else:
        fix = look
    raise LakeDiffers(problem, fix)
