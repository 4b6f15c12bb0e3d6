"""Test helpers: a real local HTTP server standing in for the external systems."""
