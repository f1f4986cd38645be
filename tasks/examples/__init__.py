"""What users copy: the example range job `cm_data` and the example order saga."""
