"""Where people already train: a ``transformers.TrainerCallback`` that shows what checkpointing did in their run."""
