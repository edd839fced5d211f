"""The trial a user writes: the protocol a trial module provides, its code record, the guards
around its code, its kinds, and the data-order helpers trials use.

May import: sweep's top-level errors, words and results, and the families below it: host.
Never imports a family above it (tests/test_structure.py holds the order)."""
