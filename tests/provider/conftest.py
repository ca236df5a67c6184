"""Airflow reads its home at import: point it at a throwaway folder before any test imports it."""

from __future__ import annotations

import os
import tempfile

os.environ.setdefault("AIRFLOW_HOME", tempfile.mkdtemp(prefix="dblog-airflow-home-"))
os.environ.setdefault("AIRFLOW__CORE__LOAD_EXAMPLES", "False")
os.environ.setdefault(
    "AIRFLOW__CORE__DAGS_FOLDER", os.path.join(os.path.dirname(__file__), "..", "..", "dags")
)
