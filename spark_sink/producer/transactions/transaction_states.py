"""The TransactionManager's state table: where the producer's identity and transaction
stand, the events that move them, and which application calls each state allows.

Shaped like the Java producer's TransactionManager.State: a transition not in
:data:`TRANSITIONS` is a bug, raised as IllegalStateError by :func:`next_state`.
"""

from __future__ import annotations

from enum import Enum

from spark_sink.client.errors import IllegalStateError


class State(Enum):
    """Where the producer's identity stands."""

    UNINITIALIZED = "UNINITIALIZED"  # no producer id: one is to be asked for
    INITIALIZING = "INITIALIZING"  # InitProducerId in flight
    READY = "READY"  # batches go out under the current producer id and epoch (transactional: none open)
    IN_TRANSACTION = "IN_TRANSACTION"
    PREPARED_TRANSACTION = "PREPARED_TRANSACTION"  # flushed, left open for another process to end
    COMMITTING_TRANSACTION = "COMMITTING_TRANSACTION"
    ABORTING_TRANSACTION = "ABORTING_TRANSACTION"
    ABORTABLE_ERROR = "ABORTABLE_ERROR"  # the transaction failed: only abort_transaction() goes on
    FATAL_ERROR = "FATAL_ERROR"  # the producer can only be closed


class Event(Enum):
    """What moves the state machine."""

    INIT_PRODUCER_ID_SENT = "INIT_PRODUCER_ID_SENT"
    PRODUCER_ID_RECEIVED = "PRODUCER_ID_RECEIVED"
    INIT_PRODUCER_ID_FAILED = "INIT_PRODUCER_ID_FAILED"  # retriably: ask again after a backoff
    EPOCH_BUMPED = "EPOCH_BUMPED"
    EPOCH_EXHAUSTED = "EPOCH_EXHAUSTED"  # the epoch cannot grow: a new producer id is needed
    BEGIN = "BEGIN"
    PREPARE = "PREPARE"
    BEGIN_COMMIT = "BEGIN_COMMIT"
    BEGIN_ABORT = "BEGIN_ABORT"
    ENDED = "ENDED"  # EndTxn answered
    ABORTABLE = "ABORTABLE"
    FATAL = "FATAL"


# State -> event -> next state. An event a state does not list is a bug: IllegalStateError.
TRANSITIONS: dict[State, dict[Event, State]] = {
    State.UNINITIALIZED: {Event.INIT_PRODUCER_ID_SENT: State.INITIALIZING, Event.FATAL: State.FATAL_ERROR},
    State.INITIALIZING: {
        Event.PRODUCER_ID_RECEIVED: State.READY,
        Event.INIT_PRODUCER_ID_FAILED: State.UNINITIALIZED,
        Event.FATAL: State.FATAL_ERROR,
    },
    State.READY: {
        Event.EPOCH_BUMPED: State.READY,
        Event.EPOCH_EXHAUSTED: State.UNINITIALIZED,
        Event.INIT_PRODUCER_ID_SENT: State.INITIALIZING,  # a transactional producer initialised again
        Event.BEGIN: State.IN_TRANSACTION,
        Event.FATAL: State.FATAL_ERROR,
    },
    State.IN_TRANSACTION: {
        Event.PREPARE: State.PREPARED_TRANSACTION,
        Event.BEGIN_COMMIT: State.COMMITTING_TRANSACTION,
        Event.BEGIN_ABORT: State.ABORTING_TRANSACTION,
        Event.ABORTABLE: State.ABORTABLE_ERROR,
        Event.FATAL: State.FATAL_ERROR,
    },
    State.PREPARED_TRANSACTION: {
        Event.BEGIN_COMMIT: State.COMMITTING_TRANSACTION,
        Event.BEGIN_ABORT: State.ABORTING_TRANSACTION,
        # Ended by another process: initialising again fences and starts afresh.
        Event.INIT_PRODUCER_ID_SENT: State.INITIALIZING,
        Event.FATAL: State.FATAL_ERROR,
    },
    State.COMMITTING_TRANSACTION: {
        Event.ENDED: State.READY,
        Event.INIT_PRODUCER_ID_SENT: State.INITIALIZING,  # the cluster moved to protocol v2: new epoch
        Event.ABORTABLE: State.ABORTABLE_ERROR,
        Event.FATAL: State.FATAL_ERROR,
    },
    State.ABORTING_TRANSACTION: {
        Event.ENDED: State.READY,
        Event.INIT_PRODUCER_ID_SENT: State.INITIALIZING,  # a sequence gap, or protocol v2 now: new epoch
        Event.FATAL: State.FATAL_ERROR,
    },
    State.ABORTABLE_ERROR: {
        Event.BEGIN_ABORT: State.ABORTING_TRANSACTION,
        Event.ABORTABLE: State.ABORTABLE_ERROR,
        Event.FATAL: State.FATAL_ERROR,
    },
    State.FATAL_ERROR: {},
}

# Where batches may be drained: the identity they need (if any) is known.
HAS_PRODUCER_ID = frozenset({
    State.READY, State.IN_TRANSACTION, State.PREPARED_TRANSACTION, State.COMMITTING_TRANSACTION,
    State.ABORTING_TRANSACTION, State.ABORTABLE_ERROR})

# Where the application's transaction calls may start: anything else is IllegalStateError.
CALL_STATES: dict[str, frozenset[State]] = {
    "init_transactions": frozenset({State.UNINITIALIZED, State.READY, State.PREPARED_TRANSACTION}),
    "begin_transaction": frozenset({State.READY}),
    "send_offsets_to_transaction": frozenset({State.IN_TRANSACTION}),
    "prepare_transaction": frozenset({State.IN_TRANSACTION}),
    "commit_transaction": frozenset({State.IN_TRANSACTION, State.PREPARED_TRANSACTION}),
    "abort_transaction": frozenset({State.IN_TRANSACTION, State.PREPARED_TRANSACTION, State.ABORTABLE_ERROR}),
}


def next_state(state: State, event: Event) -> State:
    """The state ``event`` moves ``state`` to."""
    target = TRANSITIONS[state].get(event)
    if target is None:
        raise IllegalStateError(f"producer state {state.name} does not allow {event.name}")
    return target
