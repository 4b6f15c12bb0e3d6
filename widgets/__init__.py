"""ipywidgets panels (placeholder)."""
