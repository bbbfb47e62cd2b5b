"""The live seat map in a real headless Chromium, at a desktop and a phone size.

Two people click the same seat at once; one person picks several seats and
confirms them together, watches another buyer take a seat, switches identity
and showing. Screenshots go to ``test-artifacts/seatmap/`` at the checkout's
root (gitignored; ``$DIBS_TEST_ARTIFACTS/seatmap/`` when that is set), for a
person or a CI job to keep: the module empties the folder first, so what is
there after a run is that run's.

Set-up installs what it needs: Debian's ``chromium`` through apt-get when
``/usr/bin/chromium`` is missing (the Playwright Python package, from the
test extra, drives it; its own browser download is never used).
"""

from __future__ import annotations

import asyncio
import os
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from playwright.async_api import Page, async_playwright

import dibs
from conftest import CHROMIUM_FLAGS as FLAGS
from dibs import Unit
from dibs.service import ServiceConfig, Showing
from layout import ROOT
from service_support import Running, serve_in_thread

pytestmark = pytest.mark.timeout(600)

SHOW = Showing("show-7", 5, 8)
OTHER = Showing("show-8", 4, 6)
SEAT = "seat-C5"
WAIT = 90_000  # ms: an upper bound for a loaded CI machine, not a timing claim
ARTIFACTS = (
    Path(os.environ.get("DIBS_TEST_ARTIFACTS") or ROOT / "test-artifacts").resolve() / "seatmap"
)
PNG = b"\x89PNG\r\n\x1a\n"

VIEWPORTS: dict[str, dict[str, Any]] = {
    "desktop": {"viewport": {"width": 1280, "height": 800}},
    "phone": {
        "viewport": {"width": 390, "height": 844},
        "device_scale_factor": 2,
        "is_mobile": True,
        "has_touch": True,
    },
}


@pytest.fixture(scope="module", autouse=True)
def fresh_artifacts() -> None:
    """This run's screenshots only: an earlier run's would pass for this one's."""
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    for old in ARTIFACTS.glob("*.png"):
        old.unlink()


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[Running, str]]:
    url = f"sqlite:///{tmp_path / 'dibs.db'}"
    config = ServiceConfig(store_url=url, keys_file=None, showings=(SHOW, OTHER), poll_interval=0.1)
    with serve_in_thread(config) as running:
        yield running, url


async def _states(page: Page) -> dict[str, str]:
    states: dict[str, str] = await page.eval_on_selector_all(
        ".seat", "bs => Object.fromEntries(bs.map(b => [b.dataset.seat, b.dataset.state]))"
    )
    return states


async def _wait_state(page: Page, seat: str, state: str) -> None:
    await page.wait_for_selector(f'.seat[data-seat="{seat}"][data-state="{state}"]', timeout=WAIT)


async def _shot(page: Page, name: str) -> None:
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    path = ARTIFACTS / f"{name}.png"
    await page.screenshot(path=str(path), full_page=True, animations="disabled")
    # A PNG as wide as the viewport in device pixels: the page drew, at this size.
    head = path.read_bytes()[:24]
    assert head[:8] == PNG, f"{path} is not a PNG"
    viewport = page.viewport_size
    scale = await page.evaluate("window.devicePixelRatio")
    assert viewport is not None
    assert int.from_bytes(head[16:20], "big") == round(viewport["width"] * scale), path
    print(f"screenshot: {path}")


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
                    context.set_default_timeout(WAIT)
                    page = await context.new_page()
                    await page.goto(f"{s.url}/?show={SHOW.slot}#key={token}")
                    await _wait_state(page, SEAT, "free")
                    pages[name] = page
                seat = f'.seat[data-seat="{SEAT}"]'
                # Both click at once: the store decides, exactly one wins.
                await asyncio.gather(*(page.click(seat) for page in pages.values()))
                kinds = {}
                for name, page in pages.items():
                    status = await page.wait_for_selector(
                        '#status[data-kind="held"], #status[data-kind="taken"]', timeout=WAIT
                    )
                    assert status is not None
                    kinds[name] = await status.get_attribute("data-kind")
                assert sorted(kinds.values()) == ["held", "taken"], kinds
                winner = next(n for n, k in kinds.items() if k == "held")
                loser = next(n for n, k in kinds.items() if k == "taken")
                assert "taken" in (await pages[loser].text_content("#status") or "")
                await _wait_state(pages[winner], SEAT, "mine-held")
                await _wait_state(pages[loser], SEAT, "held")
                await _shot(pages[winner], "race-winner")
                # Confirming shows up on the loser's map from the server's stream.
                await pages[winner].click("#confirm")
                await _wait_state(pages[winner], SEAT, "mine-confirmed")
                await _wait_state(pages[loser], SEAT, "confirmed")
                # The loser tries again: told at once that it is taken.
                await pages[loser].click(seat)
                await pages[loser].wait_for_selector('#status[data-kind="taken"]')
                # Another seat changes hands the other way; both maps converge.
                await pages[loser].click('.seat[data-seat="seat-A1"]')
                await _wait_state(pages[loser], "seat-A1", "mine-held")
                await _wait_state(pages[winner], "seat-A1", "held")
                views = [await _states(page) for page in pages.values()]
                plain = [{k: v.removeprefix("mine-") for k, v in view.items()} for view in views]
                assert plain[0] == plain[1]
                assert len(plain[0]) == SHOW.rows * SHOW.cols
                await _shot(pages[loser], "race-loser")
            finally:
                await browser.close()
        with dibs.open(url) as store:
            assert store.holder_of(Unit(SEAT, SHOW.slot)) == winner
            assert store.holder_of(Unit("seat-A1", SHOW.slot)) == loser

    asyncio.run(scenario())


MMSS = re.compile(r"^\d\d:\d\d$")
PICKS = ["seat-A1", "seat-A2", "seat-E8"]  # E8: the far corner, under the tray on a phone
TAKEN = "seat-C4"


async def _sizes(page: Page, selector: str) -> list[dict[str, Any]]:
    sizes: list[dict[str, Any]] = await page.eval_on_selector_all(
        selector,
        """els => els.filter(e => e.offsetParent !== null).map(e => {
            const r = e.getBoundingClientRect();
            return {id: e.id || e.dataset.seat, width: r.width, height: r.height};
        })""",
    )
    return sizes


@pytest.mark.parametrize("size", list(VIEWPORTS))
def test_one_buyer_picks_several_seats_and_confirms_them_together(
    chromium: str, served: tuple[Running, str], size: str
) -> None:
    s, url = served
    alice, bob = s.token("alice"), s.token("bob")

    async def scenario() -> None:
        async with async_playwright() as p:
            browser = await p.chromium.launch(executable_path=chromium, args=FLAGS)
            try:
                context = await browser.new_context(**VIEWPORTS[size])
                context.set_default_timeout(WAIT)
                page = await context.new_page()
                await page.goto(f"{s.url}/?show={SHOW.slot}#key={alice}")
                await _wait_state(page, "seat-A1", "free")
                # Who you are, what is live, and the favicon.
                await page.wait_for_selector("#who:not([hidden])")
                assert await page.text_content("#me") == "alice"
                assert "You are alice" in " ".join((await page.inner_text("#who")).split())
                await page.wait_for_function(
                    "document.getElementById('live').textContent.startsWith('Live — updated')"
                )
                icon = await page.get_attribute("link[rel=icon]", "href")
                assert icon is not None and icon.startswith("data:image/svg+xml")
                drawn = await page.evaluate(
                    """() => new Promise(done => {
                        const image = new Image();
                        image.onload = () => done(image.naturalWidth);
                        image.onerror = () => done(0);
                        image.src = document.querySelector('link[rel=icon]').href;
                    })"""
                )
                assert drawn > 0, "the favicon does not draw"
                assert await page.text_content("#slot") == SHOW.slot
                # Words for people: no snapshot versions ("live · v3") or other internals.
                shown = await page.inner_text("body")
                assert not re.search(r"\bv\d+\b|·\s*v\d|snapshot|undefined|null", shown), shown

                # Record every seat that plays the "someone else took it" animation.
                await page.evaluate(
                    """() => {
                        window.takenNow = [];
                        new MutationObserver(ms => ms.forEach(m => {
                            if (m.target.classList.contains('just-taken'))
                                window.takenNow.push(m.target.dataset.seat);
                        })).observe(document.getElementById('map'),
                                    {subtree: true, attributeFilter: ['class']});
                    }"""
                )

                # Several seats: each click holds one, and all of them stay selected.
                for n, seat in enumerate(PICKS, 1):
                    await page.click(f'.seat[data-seat="{seat}"]')
                    await _wait_state(page, seat, "mine-held")
                    await page.wait_for_function(
                        f"document.getElementById('summary').textContent.includes('{n} seat')"
                    )
                assert await page.text_content("#confirm") == f"Confirm {len(PICKS)} seats"
                for seat in PICKS:
                    left = await page.text_content(f'.seat[data-seat="{seat}"] .t')
                    assert left is not None and MMSS.match(left), left
                    assert "01:00" < left <= "02:00", left
                summary = await page.text_content("#summary") or ""
                held = r"3 seats held: A1, A2 and E8 · \d\d:\d\d left to confirm"
                assert re.search(held, summary), summary

                # Tap targets: every seat and control at least 44 px, measured in the page.
                sizes = await _sizes(page, ".seat, #confirm, #release, #switch, #showing")
                assert len(sizes) == SHOW.rows * SHOW.cols + 4
                small = [b for b in sizes if b["width"] < 44 or b["height"] < 44]
                assert not small, small

                # Another buyer takes a seat: it animates on this page.
                with s.client("bob") as c:
                    body = {"targets": [{"resource": TAKEN, "slot": SHOW.slot}], "ttl": 90}
                    assert c.post("/v1/claims", json=body).status_code == 201
                await page.wait_for_function(f"window.takenNow.includes('{TAKEN}')")
                await _wait_state(page, TAKEN, "held")
                # Only the other buyer's seat, never alice's own picks.
                assert set(await page.evaluate("window.takenNow")) == {TAKEN}
                other = await page.text_content(f'.seat[data-seat="{TAKEN}"] .t')
                assert other is not None and MMSS.match(other), other
                await _shot(page, f"{size}-held")

                # Confirm acts on every held seat, not the last one clicked.
                await page.click("#confirm")
                for seat in PICKS:
                    await _wait_state(page, seat, "mine-confirmed")
                status = await page.text_content("#status") or ""
                assert "Seats A1, A2 and E8 are yours." in status
                assert await page.is_hidden("#confirm")
                await _shot(page, f"{size}-confirmed")

                # Switch identity: bob sees alice's seats as sold and his own hold.
                await page.click("#switch")
                await page.wait_for_selector("#login:not([hidden])")
                await page.fill("#key", bob)
                await page.click("#login button")
                await page.wait_for_function("document.getElementById('me').textContent === 'bob'")
                assert "You are now bob" in (await page.text_content("#status") or "")
                await _wait_state(page, TAKEN, "mine-held")
                for seat in PICKS:
                    await _wait_state(page, seat, "confirmed")
                await _shot(page, f"{size}-switched")

                # Pick another showing: its own seats, the same person.
                await page.select_option("#showing", OTHER.slot)
                await page.wait_for_url(f"**/?show={OTHER.slot}")
                await _wait_state(page, "seat-D6", "free")
                assert await page.text_content("#slot") == OTHER.slot
                states = await _states(page)
                assert len(states) == OTHER.rows * OTHER.cols
                assert set(states.values()) == {"free"}
                await page.wait_for_function("document.getElementById('me').textContent === 'bob'")
                await _shot(page, f"{size}-other-showing")
            finally:
                await browser.close()
        with dibs.open(url) as store:
            for seat in PICKS:
                claims = store.claims_of("alice")
                assert store.holder_of(Unit(seat, SHOW.slot)) == "alice"
            assert {c.state for c in claims} == {dibs.ClaimState.CONFIRMED}
            assert len(claims) == len(PICKS)

    asyncio.run(scenario())


def test_a_hold_that_runs_out_says_so(chromium: str, served: tuple[Running, str]) -> None:
    s, _ = served

    async def scenario() -> None:
        async with async_playwright() as p:
            browser = await p.chromium.launch(executable_path=chromium, args=FLAGS)
            try:
                page = await browser.new_page(**VIEWPORTS["desktop"])
                page.set_default_timeout(WAIT)
                # A short hold made elsewhere (another tab): long enough for the page
                # to load and find it, short enough to watch it run out.
                with s.client("carol") as c:
                    body = {"targets": [{"resource": "seat-B2", "slot": SHOW.slot}], "ttl": 10}
                    assert c.post("/v1/claims", json=body).status_code == 201
                await page.goto(f"{s.url}/?show={SHOW.slot}#key={s.token('carol')}")
                await _wait_state(page, "seat-B2", "mine-held")
                await page.wait_for_function(
                    "document.getElementById('status').textContent.includes('ran out')",
                    timeout=WAIT,
                )
                assert "Your hold on B2 ran out" in (await page.text_content("#status") or "")
                await _wait_state(page, "seat-B2", "free")
                assert await page.is_hidden("#tray")
            finally:
                await browser.close()

    asyncio.run(scenario())
