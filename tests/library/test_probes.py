"""The profile's probes: what XLA's counting rule costs a run."""

import threading
import time

from jaxtrain._src import probes


def test_the_counting_rule_compiles_once_when_two_threads_ask_at_once(monkeypatch):
    measured = []

    def measure() -> bool:  # the real one compiles a scan (0.1-0.3 s): a run's profile thread and main thread overlap
        measured.append(1)
        time.sleep(0.05)
        return True

    monkeypatch.setattr(probes, "_measure_loop_body_count", measure)
    probes._counted_once.cache_clear()
    try:
        answers = []
        threads = [threading.Thread(target=lambda: answers.append(probes.loop_body_counted_once())) for _ in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert answers == [True, True] and len(measured) == 1
    finally:
        probes._counted_once.cache_clear()  # the next caller measures the real rule
