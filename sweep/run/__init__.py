"""Running a study: one worker's loop over trials (skip, adopt, ask), a claimed trial's attempts
(fenced by its claim, retried), the pool of worker processes, the plan, the preflight check of a
trial's code, and the log lines.

May import: sweep's top-level errors, words and results, and the families below it: host, trial, study, store, checkpoints, train, schedulers, tracking.
Never imports a family above it (tests/test_structure.py holds the order)."""
