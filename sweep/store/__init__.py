"""The Optuna boundary: the study session over Optuna's storage behind one interface (backend.py:
RDB storages, rdb.py; Optuna's journal on a file or Redis, journal.py), claims and leases
(claims.py, journal_claims.py), riding out outages, the trial record, samplers, enqueued and warm-started trials.

May import: sweep's top-level errors, words and results, and the families below it: host, trial, study.
Never imports a family above it (tests/test_structure.py holds the order)."""
