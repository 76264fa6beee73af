"""pipelines: see docs/architecture.md."""
