"""Orchestration: claiming a run directory once, launching ranks, and running record, replay, fine-tune and
verify jobs. Nothing below this package imports it (tests/test_dependencies.py)."""
