"""analysis: see docs/architecture.md."""
