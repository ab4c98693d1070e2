"""A study defined outside storebench, for ``tests/test_extending.py``."""
