"""IPython extension (placeholder)."""
