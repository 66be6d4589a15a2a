"""The ops of a step that XLA:CPU runs slowly inside a loop body, named for the run's reports.

When the form measurement (`choosers.StepForm`) finds a step slower inside the `lax.scan` loop than
as a plain program, the reports say which of the step's ops are the known cause: convolutions
(`conv_general_dilated`, forward and both gradients; jax#12868) and the max-pool gradient
(`select_and_scatter_add`), counted in the step's jaxpr, sub-jaxprs included.
"""

from __future__ import annotations

import collections
from typing import Any, Callable

import jax
from jax.extend.core import jaxprs_in_params

# primitive -> what a user recognises it as
LOOP_SLOW = {"conv_general_dilated": "convolutions (lax.conv_general_dilated: nnx.Conv, their gradients)",
             "select_and_scatter_add": "max-pool gradients (select_and_scatter_add)"}


def count_primitives(jaxpr: Any, counts: collections.Counter | None = None) -> collections.Counter:
    """How often each primitive occurs in `jaxpr` (a `ClosedJaxpr` or `Jaxpr`), sub-jaxprs included."""
    counts = collections.Counter() if counts is None else counts
    for eqn in getattr(jaxpr, "jaxpr", jaxpr).eqns:
        counts[eqn.primitive.name] += 1
        for sub in jaxprs_in_params(eqn.params):
            count_primitives(sub, counts)
    return counts


def loop_slow_ops(fn: Callable, *args: Any) -> str | None:
    """The known loop-slow ops of `fn(*args)` (abstract arguments are enough) as one phrase, e.g.
    "6 convolutions (...), 2 max-pool gradients (...)"; None when it has none or cannot be traced."""
    try:
        counts = count_primitives(jax.make_jaxpr(fn)(*args))
    except Exception:  # noqa: BLE001 - a report's detail: never fail the run for it
        return None
    found = [f"{counts[p]} {what}" for p, what in LOOP_SLOW.items() if counts[p]]
    return ", ".join(found) or None
