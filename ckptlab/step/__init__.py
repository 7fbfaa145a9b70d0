"""One training step: probe, meters, measured (measure) or on fake tensors (simulate), and its timeline."""
