"""Helpers that drive a real JupyterLab in Debian's Chromium (see jupyterlab.py)."""
