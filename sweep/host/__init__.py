"""The host a run lives on: signals and their grace, device slots, per-thread CPU clocks.

May import: sweep's top-level errors, words and results only.
Never imports a family above it (tests/test_structure.py holds the order)."""
