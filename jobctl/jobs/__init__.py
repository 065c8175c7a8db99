"""The life of a job as a service: submission, refresh, cancel, requeue, recovery, watch, report."""
