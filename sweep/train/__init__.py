"""Training one trial: the loop, its compiled functions and their compile events, the training
state, streaming input, the save cadence, the RAM tier's saves (ram_saves.py) and the goodput ledger.

May import: sweep's top-level errors, words and results, and the families below it: host, trial, study, store, checkpoints.
Never imports a family above it (tests/test_structure.py holds the order)."""
