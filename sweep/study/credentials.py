"""Secrets in study files: `${VAR}` from the environment, and URLs shown without their password.

A study file is committed to git and pasted into issues, and sweep's output goes to shared logs,
so a database password belongs in the environment (`storage: postgresql://u:${DB_PASSWORD}@host/db`)
and every URL sweep prints is masked with SQLAlchemy's own rendering (`u:***@host`).

Only the keys in `INTERPOLATED` take `${VAR}`: none of them defines what a trial means, so none is
in the study's fingerprint or its storage rows. `${VAR}` anywhere else is an error (a value there
is stored with the study, where a secret must not go); `$${` writes a literal `${`.

Imports neither optuna nor jax (the config loader uses it).
"""

from __future__ import annotations

import os
import re
from typing import Any, Iterable, Iterator, Mapping

from sweep.errors import ConfigError

# Dotted keys whose string value may hold ${VAR}: where the study's data lives, never what it means.
INTERPOLATED = ("storage", "workdir", "checkpoint.remote", "parallel.address", "logging.mlflow")
MASK = "***"
# `$${` is an escaped `${`; `${NAME}` a variable; any other `${` a mistake (`${DB PASSWORD}`, `${X`).
_TOKEN = re.compile(r"\$\$\{|\$\{([A-Za-z_][A-Za-z0-9_]*)\}|\$\{")
# Query parameters of a database URL that carry a secret (libpq takes `?password=`).
_SECRET_QUERY = re.compile(r"pass|secret|token|key", re.IGNORECASE)
# Values too short to scrub from free text without garbling it (the URL itself is still masked).
_MIN_SCRUB = 4
# The passwords of the storage URLs this process opened: scrubbed from every line sweep prints (the
# CLI's error line, its log handler), should a library's message ever echo one. Process-wide on
# purpose, like logging's own configuration: a database error can surface anywhere.
_KNOWN: set[str] = set()


def interpolate(raw: Mapping[str, Any], origin: str, env: Mapping[str, str] | None = None
                ) -> tuple[dict[str, Any], dict[str, str]]:
    """The study's keys with `${VAR}` replaced in the `INTERPOLATED` keys, and the variables used.

    Args:
        raw: the study file's keys as YAML gave them (left unchanged).
        origin: the study file, named in errors.
        env: where variables are looked up (default: the process environment).

    Raises:
        ConfigError: a variable is not set, a `${` is not a variable, or `${VAR}` is in a key that
            does not take it (exit 2; nothing was created).
    """
    env = os.environ if env is None else env
    used: dict[str, str] = {}

    def walk(value: Any, key: str) -> Any:
        if isinstance(value, dict):
            return {k: walk(v, f"{key}.{k}" if key else str(k)) for k, v in value.items()}
        if isinstance(value, list):
            return [walk(v, f"{key}.{i}") for i, v in enumerate(value)]
        if isinstance(value, str) and "${" in value:
            return _substitute(value, key, origin, env, used)
        return value

    return walk(dict(raw), ""), used


def _substitute(text: str, key: str, origin: str, env: Mapping[str, str], used: dict[str, str]) -> str:
    def one(match: re.Match[str]) -> str:
        if match.group(0) == "$${":
            return "${"
        name = match.group(1)
        if name is None:
            raise ConfigError(origin, key, "'${' must start a variable like ${DB_PASSWORD} (a name of letters, "
                                           "digits and _, then '}'; write $${ for a literal ${)", text)
        if key not in INTERPOLATED:
            raise ConfigError(origin, key, f"${{{name}}}: environment variables are only read in "
                                           f"{', '.join(INTERPOLATED)} (other values are stored with the study; "
                                           "write $${ for a literal ${)")
        if name not in env:
            raise ConfigError(origin, key, f"environment variable {name} is not set (the study file says "
                                           f"${{{name}}}); set it, or write the value")
        used[name] = env[name]
        return env[name]

    return _TOKEN.sub(one, text)


def mask_url(url: str) -> str:
    """`url` as sweep shows it: the password (and any secret query parameter) as `***`.

    SQLAlchemy's `render_as_string(hide_password=True)` masks the password but not a
    `?password=` query parameter, which libpq also takes: that one is masked here. A string that is
    not a database URL (an s3:// address, say) comes back unchanged.
    """
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError

    try:
        parsed = make_url(url)
    except (ArgumentError, ValueError):
        return url
    if parsed.password is None and not any(_SECRET_QUERY.search(k) for k in parsed.query):
        return url  # nothing to hide: as written (SQLAlchemy would percent-encode a SQLite path's é)
    query = {k: (MASK if _SECRET_QUERY.search(k) else v) for k, v in parsed.query.items()}
    # render_as_string quotes the query's "***" as %2A%2A%2A: shown as written.
    return parsed.set(query=query).render_as_string(hide_password=True).replace("%2A%2A%2A", MASK)


def secrets_of(url: str) -> Iterator[str]:
    """The secret parts of a database URL: its password and its secret query parameters."""
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError

    try:
        parsed = make_url(url)
    except (ArgumentError, ValueError):
        return
    if parsed.password:
        yield str(parsed.password)
    for key, value in parsed.query.items():
        if _SECRET_QUERY.search(key):
            yield from ([value] if isinstance(value, str) else value)


def used_in(text: Any, used: Mapping[str, str]) -> list[str]:
    """The values of the variables of `used` that `text` (a key as the file wrote it) names."""
    return [value for name, value in used.items() if isinstance(text, str) and f"${{{name}}}" in text]


def remember(url: str, values: Iterable[str] = ()) -> None:
    """Scrub `url`'s secrets from every line this process prints from now on, and those of `values`
    (the variables the URL was made of) that are part of a secret as written (a password may be
    URL-encoded in the variable: `p%40ss` for `p@ss`); a variable for the host is no secret."""
    from urllib.parse import unquote

    found = list(secrets_of(url))
    found += [v for v in values if any(unquote(v) and unquote(v) in s for s in found)]
    _KNOWN.update(s for s in found if len(s) >= _MIN_SCRUB)


def scrub(text: str) -> str:
    """`text` with every remembered secret replaced by `***` (longest first: one may contain another)."""
    for secret in sorted(_KNOWN, key=len, reverse=True):
        text = text.replace(secret, MASK)
    return text
