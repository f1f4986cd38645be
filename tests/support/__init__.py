"""Test helpers shared by every test package."""
