"""Test-session hooks shared by every test file."""

from __future__ import annotations


def pytest_collection_modifyitems(config, items):
    """The tests marked slow first, each file's in their order: pytest-xdist hands tests out
    in collection order, so the long ones start while the other worker takes the many short
    ones, instead of one worker finishing a long test alone at the end (CI's 2 cores)."""
    items.sort(key=lambda item: item.get_closest_marker("slow") is None)
