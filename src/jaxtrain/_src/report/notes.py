"""Notes: one line on stderr about something the run did for the user (a fallback, a fresh start)."""

from __future__ import annotations

import sys

import jax

from jaxtrain._src.errors import render


def note(text: str) -> None:
    """Prints `note: text` to stderr (process 0 of a job only), its settings rendered in the current
    style (`errors.render`: Python, or flags under the command line)."""
    if jax.process_index() == 0:
        print(f"note: {render(text)}", file=sys.stderr, flush=True)
