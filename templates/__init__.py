"""Jinja templates of generated files (found through importlib.resources)."""
