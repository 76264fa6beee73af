"""analysis: see README architecture."""
