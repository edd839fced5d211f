"""Schedulers that pause, promote and exploit trials: the base class every scheduler extends
(base.py), asha, hyperband, pbt and freeze_thaw (one module each, named in
sweep/study/scheduler_keys.py's registry; freeze_thaw's learning-curve model in curve_model.py), and
replay of a PBT lineage.

May import: sweep's top-level errors, words and results, and the families below it: host, trial, study, store, checkpoints, train.
Never imports a family above it (tests/test_structure.py holds the order)."""
