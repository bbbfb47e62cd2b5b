"""The live seat map in a real headless Chromium: two people click the same seat at once.

Set-up installs what it needs: Debian's ``chromium`` through apt-get when
``/usr/bin/chromium`` is missing (the Playwright Python package, from the
test extra, drives it; its own browser download is never used).
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest
from playwright.async_api import Page, async_playwright

import dibs
from conftest import CHROMIUM_FLAGS as FLAGS
from dibs import Unit
from dibs.service import ServiceConfig, Showing
from test_service_support import Running, serve_in_thread

pytestmark = pytest.mark.timeout(600)

SHOW = Showing("show-7", 5, 8)
SEAT = "seat-C5"


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[Running, str]]:
    url = f"sqlite:///{tmp_path / 'dibs.db'}"
    config = ServiceConfig(store_url=url, keys_file=None, showings=(SHOW,), poll_interval=0.1)
    with serve_in_thread(config) as running:
        yield running, url


async def _states(page: Page) -> dict[str, str]:
    states: dict[str, str] = await page.eval_on_selector_all(
        "g.seat", "gs => Object.fromEntries(gs.map(g => [g.dataset.seat, g.dataset.state]))"
    )
    return states


async def _wait_state(page: Page, seat: str, state: str) -> None:
    await page.wait_for_selector(f'g[data-seat="{seat}"][data-state="{state}"]', timeout=20_000)


def test_two_browsers_click_the_same_seat_at_once(
    chromium: str, served: tuple[Running, str], tmp_path: Path
) -> None:
    s, url = served
    tokens = {name: s.token(name) for name in ("ann", "ben")}

    async def scenario() -> None:
        async with async_playwright() as p:
            browser = await p.chromium.launch(executable_path=chromium, args=FLAGS)
            try:
                pages = {}
                for name, token in tokens.items():
                    context = await browser.new_context()
                    page = await context.new_page()
                    await page.goto(f"{s.url}/?show={SHOW.slot}#key={token}")
                    await _wait_state(page, SEAT, "free")
                    pages[name] = page
                seat = f'g[data-seat="{SEAT}"]'
                # Both click at once: the store decides, exactly one wins.
                await asyncio.gather(*(page.click(seat) for page in pages.values()))
                kinds = {}
                for name, page in pages.items():
                    status = await page.wait_for_selector(
                        '#status[data-kind="held"], #status[data-kind="taken"]', timeout=20_000
                    )
                    assert status is not None
                    kinds[name] = await status.get_attribute("data-kind")
                assert sorted(kinds.values()) == ["held", "taken"], kinds
                winner = next(n for n, k in kinds.items() if k == "held")
                loser = next(n for n, k in kinds.items() if k == "taken")
                assert "taken" in (await pages[loser].text_content("#status") or "")
                await _wait_state(pages[winner], SEAT, "mine-held")
                await _wait_state(pages[loser], SEAT, "held")
                await pages[winner].screenshot(path=str(tmp_path / "winner.png"))
                # Confirming shows up on the loser's map from the server's stream.
                await pages[winner].click("#confirm")
                await _wait_state(pages[winner], SEAT, "mine-confirmed")
                await _wait_state(pages[loser], SEAT, "confirmed")
                # The loser tries again: told at once that it is taken.
                await pages[loser].click(seat)
                await pages[loser].wait_for_selector('#status[data-kind="taken"]')
                # Another seat changes hands the other way; both maps converge.
                await pages[loser].click('g[data-seat="seat-A1"]')
                await _wait_state(pages[loser], "seat-A1", "mine-held")
                await _wait_state(pages[winner], "seat-A1", "held")
                views = [await _states(page) for page in pages.values()]
                plain = [{k: v.removeprefix("mine-") for k, v in view.items()} for view in views]
                assert plain[0] == plain[1]
                assert len(plain[0]) == SHOW.rows * SHOW.cols
                await pages[loser].screenshot(path=str(tmp_path / "loser.png"))
            finally:
                await browser.close()
        with dibs.open(url) as store:
            assert store.holder_of(Unit(SEAT, SHOW.slot)) == winner
            assert store.holder_of(Unit("seat-A1", SHOW.slot)) == loser

    asyncio.run(scenario())
