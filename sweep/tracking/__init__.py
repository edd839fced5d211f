"""Training curves where users look: the queues the trial loop fills and the TensorBoard and
MLflow writers.

May import: sweep's top-level errors, words and results, and the families below it: host, trial, study, store, checkpoints, train, schedulers.
Never imports a family above it (tests/test_structure.py holds the order)."""
