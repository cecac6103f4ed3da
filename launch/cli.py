"""Command-line handling shared by the launchers."""

from __future__ import annotations


def split_overrides(argv: list[str]) -> tuple[list[str], list[str]]:
    """Splits argv at the first '--': the rest goes verbatim to trip_jax.main."""
    if "--" not in argv:
        return argv, []
    i = argv.index("--")
    if "--dry-run" in argv[i + 1:]:
        raise SystemExit("--dry-run after '--' would go to trip_jax.main; put it before '--'")
    return argv[:i], argv[i + 1:]
