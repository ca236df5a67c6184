"""The Airflow provider: hooks, operators, sensors and triggers over the engine. Every Airflow
import of the package is in ``compat``."""

from __future__ import annotations

from typing import Any

from airflow_dblog import __version__
from airflow_dblog.provider.connections import CONN_FIELDS, CONN_TYPE, HIDDEN_FIELDS


def get_provider_info() -> dict[str, Any]:
    """What ``airflow providers list`` and the connection form know about this package."""
    return {
        "package-name": "airflow-dblog",
        "name": "DBLog change data capture",
        "description": "Watermark-based CDC dumps of MySQL/MariaDB and PostgreSQL into Delta "
        "Lake and Kafka, planned and tracked from Airflow.",
        "versions": [__version__],
        "hooks": [
            {"integration-name": "DBLog", "python-modules": ["airflow_dblog.provider.hooks.dblog"]}
        ],
        "operators": [
            {
                "integration-name": "DBLog",
                "python-modules": ["airflow_dblog.provider.operators.dblog"],
            }
        ],
        "sensors": [
            {
                "integration-name": "DBLog",
                "python-modules": ["airflow_dblog.provider.sensors.dblog"],
            }
        ],
        "triggers": [
            {
                "integration-name": "DBLog",
                "python-modules": ["airflow_dblog.provider.triggers.dblog"],
            }
        ],
        "connection-types": [
            {
                "connection-type": CONN_TYPE,
                "hook-class-name": "airflow_dblog.provider.hooks.dblog.DblogHook",
                "hook-name": "DBLog change data capture",
                # Airflow 3.2+ renders the form from these, without importing the hook
                "conn-fields": CONN_FIELDS,
                "ui-field-behaviour": {"hidden-fields": HIDDEN_FIELDS},
            }
        ],
        "integrations": [
            {
                "integration-name": "DBLog",
                "external-doc-url": "https://netflixtechblog.com/dblog-a-generic-change-data-capture-framework-69351fb9099b",
                "tags": ["software"],
            }
        ],
    }
