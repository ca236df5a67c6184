"""The pipe that ends a log read's wait from another thread."""

from __future__ import annotations

import select
import threading

from airflow_dblog.sources.base import Wake


def test_a_wake_is_set_until_cleared_however_often_it_was_set() -> None:
    wake = Wake()
    assert not wake.is_set()
    wake.set()
    wake.set()
    assert wake.is_set()
    wake.clear()
    assert not wake.is_set()
    wake.close()


def test_a_wake_set_by_another_thread_ends_a_select_on_it() -> None:
    wake = Wake()
    threading.Timer(0.05, wake.set).start()
    assert select.select([wake], [], [], 30)[0] == [wake]
    wake.close()


def test_setting_a_closed_wake_does_nothing() -> None:
    wake = Wake()
    wake.close()
    wake.set()  # a chunk's future may finish after the stream stopped
    assert wake.fileno() == -1
