"""Many steps and no step: sweeps, the formula's predictions and their accuracy, budgets, scale, published references."""
