"""Notes: one line on stderr about something the run did for the user (a fallback, a fresh start)."""

from __future__ import annotations

import sys

import jax


def note(text: str) -> None:
    """Prints `note: text` to stderr (process 0 of a job only)."""
    if jax.process_index() == 0:
        print(f"note: {text}", file=sys.stderr, flush=True)
