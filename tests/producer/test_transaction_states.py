"""Every entry of the TransactionManager's state table, allowed and refused, driven through
the manager itself: each (state, event) pair the table lists moves the manager where the
table says; every pair it does not list is refused with IllegalStateError naming both, and
leaves the state alone. Which application calls each state allows (CALL_STATES) likewise.
Pure: no broker, no clock."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given
from hypothesis import strategies as st

from spark_sink.client.errors import IllegalStateError
from spark_sink.producer.config import ProducerConfig
from spark_sink.producer.transactions.transaction_manager import TransactionManager
from spark_sink.producer.transactions.transaction_states import CALL_STATES, TRANSITIONS, Event, State

PAIRS = list(itertools.product(State, Event))
ALLOWED = [(s, e) for s, e in PAIRS if e in TRANSITIONS[s]]
REFUSED = [(s, e) for s, e in PAIRS if e not in TRANSITIONS[s]]


def _manager(state: State) -> TransactionManager:
    manager = TransactionManager(ProducerConfig.from_dict({"bootstrap.servers": "localhost:9092",
                                                           "transactional.id": "t"}))
    manager.state = state
    return manager


def test_the_table_names_every_state_and_only_states_and_events() -> None:
    assert set(TRANSITIONS) == set(State)
    assert all(isinstance(e, Event) and isinstance(t, State) for row in TRANSITIONS.values() for e, t in row.items())
    assert ALLOWED and REFUSED


@pytest.mark.parametrize(("state", "event"), ALLOWED, ids=lambda v: v.name)
def test_allowed_transition(state: State, event: Event) -> None:
    manager = _manager(state)
    manager._transition(event)
    assert manager.state is TRANSITIONS[state][event]


@pytest.mark.parametrize(("state", "event"), REFUSED, ids=lambda v: v.name)
def test_refused_transition(state: State, event: Event) -> None:
    manager = _manager(state)
    with pytest.raises(IllegalStateError, match=f"{state.name} does not allow {event.name}"):
        manager._transition(event)
    assert manager.state is state


def test_every_state_is_reached_from_the_start_and_only_fatal_is_final() -> None:
    reached, frontier = {State.UNINITIALIZED}, [State.UNINITIALIZED]
    while frontier:
        for target in TRANSITIONS[frontier.pop()].values():
            if target not in reached:
                reached.add(target)
                frontier.append(target)
    assert reached == set(State)
    assert [s for s in State if not TRANSITIONS[s]] == [State.FATAL_ERROR]
    assert all(TRANSITIONS[s].get(Event.FATAL) is State.FATAL_ERROR for s in State if s is not State.FATAL_ERROR)


@pytest.mark.parametrize(("call", "state"), list(itertools.product(CALL_STATES, State)),
                         ids=lambda v: v if isinstance(v, str) else v.name)
def test_calls_allowed_only_in_their_states(call: str, state: State) -> None:
    manager = _manager(state)
    if state in CALL_STATES[call]:
        manager._check_call(call)
    else:
        # IllegalStateError, or the error behind an abortable or fatal state (both name the call)
        with pytest.raises(Exception, match=f"{call}\\(\\)"):
            manager._check_call(call)
    assert manager.state is state


@given(st.lists(st.sampled_from(Event), max_size=40))
def test_random_walks_follow_the_table(events: list[Event]) -> None:
    """Any run of events: the manager ends where the table leads, refused events skipped."""
    manager, expected = _manager(State.UNINITIALIZED), State.UNINITIALIZED
    for event in events:
        if event in TRANSITIONS[expected]:
            expected = TRANSITIONS[expected][event]
            manager._transition(event)
        else:
            with pytest.raises(IllegalStateError):
                manager._transition(event)
        assert manager.state is expected
