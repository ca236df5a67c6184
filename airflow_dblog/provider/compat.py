"""Every Airflow import of the package lives here: Airflow 3's Task SDK first, 2.10+ after."""

from __future__ import annotations

from typing import Any

try:  # Airflow 3
    from airflow.sdk import (
        DAG,
        Asset,
        AssetAlias,
        AssetAny,
        BaseHook,
        BaseOperator,
        BaseSensorOperator,
        Context,
        Param,
        task,
    )
except ImportError:  # pragma: no cover - Airflow 2.10/2.11
    from airflow import DAG  # type: ignore[no-redef]
    from airflow.datasets import Dataset as Asset  # type: ignore[no-redef]
    from airflow.datasets import DatasetAlias as AssetAlias  # type: ignore[no-redef]
    from airflow.datasets import DatasetAny as AssetAny  # type: ignore[no-redef]
    from airflow.decorators import task  # type: ignore[no-redef]
    from airflow.hooks.base import BaseHook  # type: ignore[no-redef]
    from airflow.models import BaseOperator, Param  # type: ignore[no-redef]
    from airflow.sensors.base import BaseSensorOperator  # type: ignore[no-redef]
    from airflow.utils.context import Context  # type: ignore[no-redef]

from airflow.triggers.base import BaseTrigger, TriggerEvent


def openlineage_classes() -> tuple[Any, Any] | None:
    """``(OperatorLineage, Dataset)`` of the OpenLineage provider, or None when it is absent.

    The provider is optional and never a dependency: without it there is no lineage to report.
    """
    try:
        from airflow.providers.common.compat.openlineage.facet import Dataset
        from airflow.providers.openlineage.extractors import OperatorLineage
    except ImportError:
        return None
    return OperatorLineage, Dataset


__all__ = [
    "DAG",
    "Asset",
    "AssetAlias",
    "AssetAny",
    "BaseHook",
    "BaseOperator",
    "BaseSensorOperator",
    "BaseTrigger",
    "Context",
    "Param",
    "TriggerEvent",
    "openlineage_classes",
    "task",
]
