"""Benchmark-only: with this folder on PYTHONPATH and SWEEP_BENCH_SAMPLER_VIEW naming a view of
benchmarks/sampler_views.py, every Python process started (a `sweep run` and its workers) samples
through that view. benchmarks/freeze_thaw_real.py sets both for its "+rung view" side."""

import os
import sys

_view = os.environ.get("SWEEP_BENCH_SAMPLER_VIEW")
if _view:
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    import sampler_views

    sampler_views.patch(sampler_views.VIEWS[_view])
