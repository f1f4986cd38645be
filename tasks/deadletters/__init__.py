"""Dead letters: what failed for good, its store and its view."""
