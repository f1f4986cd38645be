"""Tests of the restock feature: redo-log parsing and the stock Lua scripts."""
