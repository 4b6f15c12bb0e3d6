"""Optional adapters for the libraries agents are written with (each an extra)."""
