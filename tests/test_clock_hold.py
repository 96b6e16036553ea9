"""The virtual clock's hold is a token that ends once, in scope: a ``with`` block over it, or the
receiver's block after ``Hold.hand_on`` sent it on with a message. No site pairs a hold with a
release by hand (pipeline/clock.py)."""

from __future__ import annotations

import re
from pathlib import Path

import anyio
import pytest

from pipeline.clock import Held, VirtualClock, WallClock, end_holds

ROOT = Path(__file__).resolve().parents[1]


def _sleeper(clock: VirtualClock, t: float, woke: list):
    token = clock.register()

    async def sleep() -> None:
        await clock.sleep_until(token, t)
        woke.append(clock.now())
        clock.unregister(token)

    return sleep


def test_time_stands_still_while_a_hold_lives_and_moves_when_its_block_ends():
    clock, woke = VirtualClock(), []

    async def main() -> None:
        async with anyio.create_task_group() as tg:
            with clock.hold():
                tg.start_soon(_sleeper(clock, 1.0, woke))
                for _ in range(5):
                    await anyio.lowlevel.checkpoint()
                assert woke == [] and clock.now() == 0.0  # every stream waits, but the clock is held

    anyio.run(main)
    assert woke == [1.0]


def test_a_hold_handed_on_ends_with_its_receiver_not_its_sender():
    clock = VirtualClock()
    send, receive = anyio.create_memory_object_stream(1)

    async def main() -> Held:
        with clock.hold() as hold:
            await hold.hand_on(send.send, "answer")
        assert clock._holds == 1  # the sender's block ended; the message holds the clock
        return receive.receive_nowait()

    held = anyio.run(main)
    assert held.message == "answer"
    with held.hold:
        assert clock._holds == 1
    assert clock._holds == 0
    held.hold.end()  # ending again does nothing
    assert clock._holds == 0


def test_a_hold_whose_message_could_not_be_sent_ends_with_the_senders_block():
    clock = VirtualClock()

    async def fail(message) -> None:
        raise anyio.BrokenResourceError

    async def main() -> None:
        with pytest.raises(anyio.BrokenResourceError), clock.hold() as hold:
            await hold.hand_on(fail, "answer")

    anyio.run(main)
    assert clock._holds == 0


def test_the_holds_of_messages_never_received_end():
    clock = VirtualClock()
    messages = [Held("a", clock.hold()), "a posted message", Held("b", clock.hold())]
    end_holds(messages[1:])
    assert clock._holds == 1
    end_holds(messages)
    assert clock._holds == 0


def test_a_wall_clock_hold_is_inert():
    with WallClock().hold() as hold:
        pass
    assert hold.ended


def test_no_site_releases_a_clock_by_hand():
    found = [
        f"{path.relative_to(ROOT).as_posix()}:{i}: {line.strip()}"
        for path in sorted((ROOT / "pipeline").rglob("*.py"))
        if path.name != "clock.py"
        for i, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
        if re.search(r"clock\.(release|_release)\(|\._holds\b", line)
    ]
    assert not found and not hasattr(VirtualClock, "release"), found
