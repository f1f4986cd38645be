"""Celery plumbing: the task base class, retries, message limits, queues, beat entries, the
worker's lifecycle and health, and the kombu and Flower patches."""
