"""Sinks a merged batch is written through: Delta Lake, Kafka, and an in-memory one for tests."""
