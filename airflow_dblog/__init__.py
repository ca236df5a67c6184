"""airflow-dblog: DBLog-style change data capture as a library, a Spark job and an Airflow provider.

Importing the package imports neither Airflow nor Spark; the provider parts do that themselves.
"""

from __future__ import annotations

from typing import Any

__version__ = "0.1.0"


def get_provider_info() -> dict[str, Any]:
    """What ``airflow providers list`` and the connection form know about this package."""
    return {
        "package-name": "airflow-dblog",
        "name": "DBLog change data capture",
        "description": "Watermark-based CDC dumps of MySQL/MariaDB and PostgreSQL into Delta "
        "Lake and Kafka, planned and tracked from Airflow.",
        "versions": [__version__],
        "hooks": [{"integration-name": "DBLog", "python-modules": ["airflow_dblog.hooks.dblog"]}],
        "operators": [
            {"integration-name": "DBLog", "python-modules": ["airflow_dblog.operators.dblog"]}
        ],
        "sensors": [
            {"integration-name": "DBLog", "python-modules": ["airflow_dblog.sensors.dblog"]}
        ],
        "triggers": [
            {"integration-name": "DBLog", "python-modules": ["airflow_dblog.triggers.dblog"]}
        ],
        "connection-types": [
            {"connection-type": "dblog", "hook-class-name": "airflow_dblog.hooks.dblog.DblogHook"}
        ],
        "integrations": [
            {
                "integration-name": "DBLog",
                "external-doc-url": "https://netflixtechblog.com/dblog-a-generic-change-data-capture-framework-69351fb9099b",
                "tags": ["software"],
            }
        ],
    }
