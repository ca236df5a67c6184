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
        "hooks": [],
        "operators": [],
        "sensors": [],
        "triggers": [],
        "connection-types": [],
        "extra-links": [],
    }
