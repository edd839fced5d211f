"""The Optuna boundary: the study session over Optuna's storage, direct RDB access, claims and
leases, riding out outages, the trial record, samplers, enqueued and warm-started trials.

May import: sweep's top-level errors, words and results, and the families below it: host, trial, study.
Never imports a family above it (tests/test_structure.py holds the order)."""
