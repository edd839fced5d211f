"""The commands that read or extend a study: status, progress, summary, plot, export, best,
drill, continue.

May import: sweep's top-level errors, words and results, and the families below it: host, trial, study, store, checkpoints, train, schedulers, tracking, run.
Never imports a family above it (tests/test_structure.py holds the order)."""
