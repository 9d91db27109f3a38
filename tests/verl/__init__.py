"""Tests of the verl backend (plugins: test_plugins_*.py)."""
