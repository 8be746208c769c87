"""A resource whose serving pods changed ticks now, not at its next interval (services/wakeups.py):
a new pod boots with speculation off and would decode plain until then."""

from __future__ import annotations

import asyncio

from specops.services.rest_pass import RestPass
from specops.services.wakeups import SEEN_KEPT, Wakeups

KEY = ("team", "llama-70b-chat")
PODS = ("team", "llama-70b-chat")


def registry(speculating: bool = True) -> tuple[Wakeups, RestPass]:
    rests = RestPass()
    return Wakeups(rests, lambda namespace, name: speculating), rests


async def settle() -> None:
    for _ in range(3):
        await asyncio.sleep(0)


async def test_a_new_pod_of_a_speculating_resource_ends_its_daemons_sleep_at_once() -> None:
    # Given a pod seen before its resource speculated, then a daemon sleeping 60 s, speculating
    speculating = False
    wakeups = Wakeups(RestPass(), lambda namespace, name: speculating)
    wakeups.watch(KEY, PODS)
    assert not wakeups.pod_ready(PODS, ("pod-a", "uid-a/0"))
    speculating = True
    loop = asyncio.get_running_loop()
    started = loop.time()
    sleeping = asyncio.ensure_future(wakeups.sleep(KEY, 60.0))
    await settle()

    # When the same pod is seen again, and then a new pod (or a restarted container) is ready
    assert not wakeups.pod_ready(PODS, ("pod-a", "uid-a/0"))
    await settle()
    assert not sleeping.done()
    assert wakeups.pod_ready(PODS, ("pod-a", "uid-a/1"))
    await asyncio.wait_for(sleeping, 1.0)

    # Then only the new one woke it, at once
    assert loop.time() - started < 1.0
    assert wakeups.woken == 1


async def test_the_wake_waits_until_the_index_holds_the_new_pod() -> None:
    # Given a sleeping daemon, and a pod watch whose index takes the new pod a little later
    wakeups, _ = registry()
    wakeups.watch(KEY, PODS)
    in_index = False
    sleeping = asyncio.ensure_future(wakeups.sleep(KEY, 60.0))
    await settle()

    # When the new pod is told before the index holds it
    assert wakeups.pod_ready(PODS, ("pod-b", "uid-b/0"), indexed=lambda: in_index)
    await asyncio.sleep(0.05)

    # Then the daemon sleeps on until it does, and wakes then
    assert not sleeping.done()
    in_index = True
    await asyncio.wait_for(sleeping, 1.0)


async def test_a_resource_not_speculating_is_not_woken() -> None:
    wakeups, _ = registry(speculating=False)
    wakeups.watch(KEY, PODS)
    sleeping = asyncio.ensure_future(wakeups.sleep(KEY, 0.3))
    assert not wakeups.pod_ready(PODS, ("pod-a", "uid-a/0"))
    await asyncio.sleep(0.1)
    assert not sleeping.done() and wakeups.woken == 0  # a new pod runs what it decided: off
    await asyncio.wait_for(sleeping, 1.0)  # the sleep ends on its own time


async def test_a_resource_at_rest_is_taken_out_of_the_rest_pass() -> None:
    # Given a resource held by the rest pass, looked at again only in 60 s
    wakeups, rests = registry()
    wakeups.watch(KEY, PODS)
    held = rests.hold(KEY, lambda: 60.0, 60.0)
    try:
        # When a new pod of it is ready
        wakeups.pod_ready(PODS, ("pod-c", "uid-c/0"))
        await asyncio.wait_for(held, 1.0)

        # Then its daemon's hold ended without a look, and the pass holds it no more
        assert rests.looks == 0 and rests.woken == 1 and rests.holding == 0
        assert not rests.wake(KEY)  # nothing left to wake
    finally:
        await rests.close()


async def test_a_wake_while_it_ticks_is_kept_for_after_the_tick() -> None:
    # Given a daemon neither sleeping nor at rest (ticking)
    wakeups, _ = registry()
    wakeups.watch(KEY, PODS)

    # When a new pod is ready meanwhile
    wakeups.pod_ready(PODS, ("pod-d", "uid-d/0"))
    await settle()

    # Then the daemon, its tick done, finds it (and ticks again at once), once
    assert wakeups.take_pending(KEY)
    assert not wakeups.take_pending(KEY)


async def test_unknown_and_forgotten_daemons_are_not_woken_and_memory_is_bounded() -> None:
    wakeups, _ = registry()
    assert not wakeups.pod_ready(PODS, ("pod-e", "uid-e/0"))  # no daemon for these pods yet
    wakeups.watch(KEY, PODS)
    wakeups.forget(("team", "another"), PODS)  # a late stop of another daemon: this one stays
    assert wakeups.pod_ready(PODS, ("pod-f", "uid-f/0"))
    wakeups.forget(KEY, PODS)
    assert not wakeups.pod_ready(PODS, ("pod-g", "uid-g/0"))
    assert not wakeups.take_pending(KEY)  # forgetting drops a wake kept for it
    # a resource whose pods come and go for months holds at most SEEN_KEPT of them
    wakeups.watch(KEY, PODS)
    for index in range(3 * SEEN_KEPT):
        wakeups.pod_ready(PODS, (f"pod-{index}", "uid/0"))
    assert len(wakeups._seen[PODS]) <= SEEN_KEPT
    await settle()
