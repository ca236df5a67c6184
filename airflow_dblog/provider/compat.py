"""Every Airflow import of the package lives here (Airflow 3.1+: its Task SDK)."""

from __future__ import annotations

from typing import Any

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
