"""The metadata store: dump requests, chunk plans and progress, runtime controls, stream state."""

from airflow_dblog.engine.metadata.store import MetadataStore

__all__ = ["MetadataStore"]
