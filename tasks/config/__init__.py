"""Configuration: the typed settings read from the environment, their parsers, and the one way
to build a Redis client."""
