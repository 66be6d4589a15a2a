"""Named moments of a run that a tool can watch: the seam the fault benchmark kills processes at.

The library announces each moment with `announce(name, **facts)`; a listener registered with
`listen(fn)` is called as `fn(name, facts)` in the thread that reached the moment. Nothing listens
unless a tool asks (then a moment costs one call per listener), and listeners must not raise.

    feed made            the training feed is built (`program.build_program`)
    state initialised    the initial train state is built and placed on the mesh
    lowered              a program is lowered, before XLA compiles it (facts: what)
    call                 a compiled K-step call was queued, before the hooks saw it (facts: run)
    call done            every hook has seen the call (facts: run)
    checkpoint saved     `Checkpointer.save` returned; Orbax may still be writing (facts: step, kind)
    evaluation           an epoch's validation pass starts or ended (facts: when="before" | "after", epoch)
    slot refilled        an adaptive population's slot took its new run (its sweep trial recorded), before
                         that run's first save (facts: epoch, slot)
"""

from __future__ import annotations

from typing import Any, Callable

__all__ = ["announce", "listen"]

Listener = Callable[[str, dict[str, Any]], None]
_listeners: list[Listener] = []


def listen(fn: Listener) -> Callable[[], None]:
    """Calls `fn(name, facts)` at every moment from now on; returns a function that stops it."""
    _listeners.append(fn)
    return lambda: _listeners.remove(fn)


def announce(name: str, **facts: Any) -> None:
    """Tells every listener that the run reached moment `name`."""
    for fn in list(_listeners):
        fn(name, facts)
