"""The platform's package. Its Celery app is `tasks.celery.app` (Celery's layout: `celery -A tasks`
finds it there); importing this package, or any pure module under it, does no other work."""
