"""Benchmarks: each prints a ratio against a raw baseline from the same run, then JSON."""

__all__: list[str] = []
