"""Restock: stock deduction on Redis with a redo log, a delay queue and rebuilds from the
database. The Celery tasks `tasks.restock.*` are in `tasks.restock.tasks`.
"""
