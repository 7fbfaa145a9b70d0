"""One training step: probe, memory meters and clocks, measured (measure) or on fake tensors (simulate), and its timeline."""
