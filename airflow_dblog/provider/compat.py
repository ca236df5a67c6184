"""Every Airflow import of the package lives here: Airflow 3's Task SDK first, 2.10+ after."""

from __future__ import annotations

try:  # Airflow 3
    from airflow.sdk import DAG, BaseHook, BaseOperator, BaseSensorOperator, Context, Param, task
except ImportError:  # pragma: no cover - Airflow 2.10/2.11
    from airflow import DAG  # type: ignore[no-redef]
    from airflow.decorators import task  # type: ignore[no-redef]
    from airflow.hooks.base import BaseHook  # type: ignore[no-redef]
    from airflow.models import BaseOperator, Param  # type: ignore[no-redef]
    from airflow.sensors.base import BaseSensorOperator  # type: ignore[no-redef]
    from airflow.utils.context import Context  # type: ignore[no-redef]

from airflow.triggers.base import BaseTrigger, TriggerEvent

__all__ = [
    "DAG",
    "BaseHook",
    "BaseOperator",
    "BaseSensorOperator",
    "BaseTrigger",
    "Context",
    "Param",
    "TriggerEvent",
    "task",
]
