"""Training code of trials; `trials.digits_mlp` is the built-in example."""
