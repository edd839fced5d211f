"""The study file: reading it, its schema and rules (the checkpoint section: checkpoint_keys.py), the messages of its errors, the search
space, objectives, constraints, credentials, and the fingerprint of what its trials mean.

May import: sweep's top-level errors, words and results, and the families below it: host, trial.
Never imports a family above it (tests/test_structure.py holds the order)."""
