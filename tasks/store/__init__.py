"""Storage: the shared SQL metadata and engine, per-process resources, the schema migrations."""
