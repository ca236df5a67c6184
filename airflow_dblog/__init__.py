"""airflow-dblog: DBLog-style change data capture as a library, a Spark job and an Airflow provider.

Importing the package imports neither Airflow nor Spark; the provider parts do that themselves.
Where things live: ``core`` (the algorithm, pure), ``sources`` (per database), ``engine``
(planning, chunks, the capture loop, spool, metadata), ``sinks`` (Delta, Kafka), ``spark`` (the
streaming job), ``provider`` (Airflow), ``cli``.
"""

__version__ = "0.3.0"
