"""sweep: hyperparameter sweeps with Optuna, JAX/Flax trials and Orbax checkpoints, resumable per trial."""

__version__ = "0.1.0"
