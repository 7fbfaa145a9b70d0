"""The model: presets and local folders built into transformers models, the every_n_layers plan, the code to set it."""
