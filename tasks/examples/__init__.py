"""The example order saga (`tasks.examples.order_saga`). The example range job `cm_data` is a
user's project of its own, outside the platform: `examples/` at the top of the repository."""
