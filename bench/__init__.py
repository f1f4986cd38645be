"""Benchmarks: each prints a ratio against a raw baseline measured in the same run, then a JSON line."""

__all__: list[str] = []
