"""Checkpoints: one trial's folder (the only user of Orbax), integrity, packing, reading this
release's steps without Orbax (direct_read.py), small states' one-file steps (compact.py), the
write budget (budget.py), the committed steps, the study-wide disk budget, the RAM tier in front
of the local folder (ram.py), and the tiers behind it: the CheckpointTier
protocol and its registry (tiers.py), the S3 bucket (s3.py), what runs against any tier (remote.py),
and a study's checkpoints in one process (study_checkpoints.py).

May import: sweep's top-level errors, words and results, and the families below it: host, trial, study, store.
Never imports a family above it (tests/test_structure.py holds the order)."""
