"""The metadata store on PostgreSQL and MariaDB: the tests of tests/unit/engine/metadata/
test_store.py, collected again here with these servers as the ``backend``."""

from __future__ import annotations

import pytest

from tests.unit.engine.metadata.test_store import (  # noqa: F401  collected here again
    store,
    test_a_cancel_waits_for_a_chunk_being_cut_and_cancels_it,
    test_a_newer_lease_token_fences_every_write_of_the_old_leader,
    test_a_range_dump_waits_for_the_stream_to_read_its_bound,
    test_controls_override_config_defaults,
    test_empty_table_dump_finishes_without_chunks,
    test_key_list_chunks_and_requeue_after_restart,
    test_migrations_apply_once_and_are_idempotent,
    test_no_chunk_starts_or_moves_on_after_a_cancel,
    test_pause_resume_cancel_state_machine,
    test_processes_starting_together_migrate_a_new_database_once,
    test_range_chunks_are_cut_from_the_cursor_and_finish_the_dump,
    test_reads_go_on_while_another_process_holds_a_write,
)


@pytest.fixture(params=["postgres", "mariadb"])
def backend(request: pytest.FixtureRequest) -> str:
    return request.param
