"""What the user sees on stderr: sweep's own timestamped lines; library noise only with --verbose."""

from __future__ import annotations

import logging
import sys


def setup(quiet: bool = False, verbose: bool = False) -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("[sweep %(asctime)s] %(message)s", "%H:%M:%S"))
    log = logging.getLogger("sweep")
    log.handlers[:] = [handler]
    log.setLevel(logging.WARNING if quiet else logging.INFO)
    log.propagate = False
    import optuna

    optuna.logging.set_verbosity(logging.INFO if verbose else logging.WARNING)
    for name in ("absl", "jax", "orbax"):
        logging.getLogger(name).setLevel(logging.INFO if verbose else logging.ERROR)
