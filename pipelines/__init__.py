"""pipelines: see README architecture."""
