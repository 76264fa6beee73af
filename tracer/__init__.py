"""tracer: everything that runs on the training node (see README architecture)."""
