"""Developer tooling, not the product: the demos, an embedded Redis, sample tasks."""
