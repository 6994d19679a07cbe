"""The pure decisions of peer copies (trainer_runtime/peer_copy/ring.py): node indices, the ring,
what a restore fetches from whom, and the room a copy may take."""

from __future__ import annotations

import json

from trainer_runtime.peer_copy.ring import (
    Holding,
    describe_holdings,
    node_indices,
    plan_fetches,
    predecessor,
    room,
    successor,
)


def test_node_indices_follow_the_coordinators_ranks_not_their_order_of_arrival() -> None:
    # torchrun: local rank 0 of group g has rank g x local world size; a replacement keeps it.
    assert node_indices([8, 0, 4]) == {0: 0, 4: 1, 8: 2}
    assert node_indices([]) == {}


def test_the_ring_sends_to_the_next_node_and_wraps() -> None:
    assert [successor(i, 3) for i in range(3)] == [1, 2, 0]
    assert [predecessor(i, 3) for i in range(3)] == [2, 0, 1]
    assert successor(0, 1) is None and predecessor(0, 1) is None  # one node: no peer


def _h(own: dict[int, int], peers: dict[int, dict[int, int]] | None = None) -> Holding:
    return Holding(own, peers or {})


def test_a_node_that_lost_its_copy_fetches_it_from_its_successor() -> None:
    holdings = {
        0: _h({30: 3}, {2: {30: 3}}),
        1: _h({}, {0: {30: 3}}),  # the replacement: an empty ramdisk, but it keeps nothing either
        2: _h({30: 3}, {1: {30: 3}}),  # node 1's successor keeps node 1's copy
    }
    assert plan_fetches(holdings) == {1: 30}


def test_no_fetch_when_the_successor_lacks_the_copy_or_another_node_lacks_the_step() -> None:
    lost_keeper = {0: _h({30: 3}), 1: _h({}, {0: {30: 3}})}  # node 0 kept no copy of node 1
    assert plan_fetches(lost_keeper) == {}
    other_missing = {
        0: _h({20: 2}, {2: {30: 3}}),  # node 0 has no step 30: 30 can never be common
        1: _h({}, {0: {20: 2}}),
        2: _h({30: 3}, {1: {30: 3}}),
    }
    assert plan_fetches(other_missing) == {}


def test_of_several_usable_copies_the_newest_by_commit_order_is_fetched() -> None:
    holdings = {
        0: _h({30: 3, 40: 5}, {1: {30: 3, 40: 5}}),
        1: _h({}, {0: {30: 3, 40: 5}}),
    }
    assert plan_fetches(holdings) == {1: 40}
    # Commit order, not step numbers: a run that went on from step 30 wrote 20 later.
    later = {0: _h({30: 3, 20: 9}, {1: {30: 3, 20: 9}}), 1: _h({})}
    assert plan_fetches(later) == {1: 20}


def test_a_node_that_has_its_copy_fetches_nothing_and_one_node_never_fetches() -> None:
    assert plan_fetches({0: _h({30: 3}, {1: {30: 3}}), 1: _h({30: 3}, {0: {30: 3}})}) == {}
    assert plan_fetches({0: _h({}, {0: {30: 3}})}) == {}
    # A node that did not report (no index 1): no plan at all, as nothing is known of it.
    assert plan_fetches({0: _h({30: 3}), 2: _h({30: 3})}) == {}


def test_holdings_travel_as_plain_data() -> None:
    h = Holding({30: 3}, {2: {30: 3, 20: 0}})
    assert Holding.from_wire(h.to_wire()) == h
    # The JAX agreement carries JSON (tuples become lists, no int keys): the same on arrival.
    assert Holding.from_wire(json.loads(json.dumps(h.to_wire()))) == h


def test_the_room_leaves_the_nodes_own_next_checkpoint_its_space() -> None:
    assert room(free_bytes=1000, reserve_bytes=300) == 700
    assert room(free_bytes=200, reserve_bytes=300) == 0
    assert room(free_bytes=200, reserve_bytes=-5) == 200


def test_the_restore_summary_names_what_each_node_has_and_what_is_fetched() -> None:
    holdings = {
        0: Holding(own={40: 2, 60: 3}, peers={1: {60: 3}}),
        1: Holding(own={}, peers={}),
    }
    line = describe_holdings(holdings, plan_fetches(holdings))
    assert line == (
        "node 0 has [40, 60], keeps node 1's [60]; node 1 has [], keeps nothing; "
        "fetching node 1 step 60"
    )
    assert describe_holdings({0: Holding(), 1: Holding()}, {}).endswith("fetching nothing")
