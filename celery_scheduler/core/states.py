"""The occurrence state machine as a transition table.

The table is the single source of truth: the ORM store turns each transition into a
conditional UPDATE (``WHERE state IN allowed_sources``), so an illegal transition matches
no row rather than relying on a Python check.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from celery_scheduler.core.enums import OccurrenceState as S

TRANSITIONS: Mapping[S, frozenset[S]] = {
    # SCHEDULED -> RUNNING: a worker may receive the message before the relay has marked
    # it sent (or the relay crashed in between); the claim must still succeed.
    S.SCHEDULED: frozenset({S.ENQUEUED, S.RUNNING, S.CANCELED, S.MISSED, S.SKIPPED_OVERLAP}),
    S.ENQUEUED: frozenset({S.RUNNING, S.CANCELED, S.SKIPPED_OVERLAP, S.ENQUEUED}),
    S.RUNNING: frozenset({S.SUCCEEDED, S.RETRY_WAIT, S.DEAD, S.RUNNING, S.CANCELED}),
    S.RETRY_WAIT: frozenset({S.ENQUEUED, S.RUNNING, S.CANCELED, S.DEAD}),
    S.DEAD: frozenset({S.ENQUEUED}),  # manual replay keeps the occurrence id
    S.SUCCEEDED: frozenset(),
    S.MISSED: frozenset(),
    S.CANCELED: frozenset(),
    S.SKIPPED_OVERLAP: frozenset(),
}

TERMINAL: frozenset[S] = frozenset(s for s, targets in TRANSITIONS.items() if not targets)
#: States in which an occurrence has not been claimed yet and may still be invalidated.
UNCLAIMED: frozenset[S] = frozenset({S.SCHEDULED, S.ENQUEUED, S.RETRY_WAIT})
#: States in which an occurrence may (still) be handed to the broker.
PUBLISHABLE: frozenset[S] = frozenset({S.SCHEDULED, S.ENQUEUED, S.RETRY_WAIT})

#: Terminal states retention prunes by default. DEAD is terminal too but opt-in (dead letters).
PRUNABLE_STATES: tuple[str, ...] = (S.SUCCEEDED, S.MISSED, S.CANCELED, S.SKIPPED_OVERLAP)


def sources_of(target: S, *, within: Iterable[S] | None = None) -> frozenset[S]:
    """Every state from which ``target`` may be entered (only those in ``within``, if given).

    ``within`` narrows a transition to the states one writer may move it from (the relay
    enqueues only PUBLISHABLE occurrences, never a DEAD one a replay would re-enqueue); it
    never widens it: a state the table does not allow stays out.
    """
    sources = frozenset(src for src, targets in TRANSITIONS.items() if target in targets)
    return sources if within is None else sources & frozenset(within)


def state_values(states: Iterable[S]) -> list[str]:
    """The column values of ``states`` in a stable order (for ``IN`` / ``= ANY`` parameters)."""
    return sorted(s.value for s in states)
