"""The capture engine: plan dumps, run chunks between log reads, merge, spool, commit; the
metadata store, the leader lease and the signal channel it coordinates through."""
