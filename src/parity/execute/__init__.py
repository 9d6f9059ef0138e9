"""The execute layer: one backend run on one job (execution.py), what it warned of (notes.py), and the
artifact cache its preparation goes through (cache.py)."""
