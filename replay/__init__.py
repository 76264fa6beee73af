"""replay: see README architecture."""
