"""Stand-in cupyx (see cupy/__init__.py beside it)."""
