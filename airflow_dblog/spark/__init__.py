"""The streaming job on Spark: the session and its jars, the spool as a Spark source, the job."""
