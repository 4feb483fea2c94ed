"""The status page (SPEC §20): out/status.html on every reconcile, ``status --html``, and the
page as Chromium renders it."""

from __future__ import annotations

import hashlib
import html
import json
import re
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from reconciler.cli.commands import main
from reconciler.controller.reconcile import ReconcileCache, ReconcileOptions, reconcile
from reconciler.controller.statuspage import PageMemo, page_source, render_status_page
from tests.support.chromium import dump_dom, screenshot
from tests.support.observability import BROKEN_SERVICE, synthetic_status, troubled_demo
from tests.support.png import read_png

T0 = 1_790_000_000.0


def _clock() -> float:
    return T0


def _status(state: Path) -> dict[str, Any]:
    doc = json.loads((state / "out" / "status.json").read_text())
    assert isinstance(doc, dict)
    return doc


def _digest(state: Path) -> str:
    return "sha256:" + hashlib.sha256((state / "out" / "status.json").read_bytes()).hexdigest()


@pytest.fixture
def troubled(demo_copy: Path) -> Path:
    state = troubled_demo(demo_copy)
    reconcile(state, ReconcileOptions(clock=_clock))
    return state


class TestThePageOfAReconcile:
    def test_is_written_with_the_report_and_shows_every_section(self, troubled: Path) -> None:
        page = (troubled / "out" / "status.html").read_text()
        doc = _status(troubled)
        assert doc["failures"] and doc["alerts"] and doc["invalidInputs"]  # the unit's troubles
        for node_id in doc["nodes"]:
            assert f'id="node-{node_id}"' in page
        for iid in doc["instances"]:
            assert iid in page
        for f in doc["failures"]:
            assert f["instanceId"] in page and html.escape(f["summary"]) in page
        assert "edge-1</code></a></td><td>cpu</td>" in page  # the raised alert's row
        assert BROKEN_SERVICE in page
        made = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(T0))
        assert f'<time datetime="{made}">' in page
        assert page_source(page.encode()[:2048]) == _digest(troubled)

    def test_a_run_that_changes_nothing_leaves_it(self, demo_copy: Path) -> None:
        reconcile(demo_copy, ReconcileOptions(clock=_clock))
        page = demo_copy / "out" / "status.html"
        before = page.read_bytes()
        report = reconcile(demo_copy, ReconcileOptions(clock=lambda: T0 + 60))
        assert report.written == ()
        assert page.read_bytes() == before  # its time is when it was made

    def test_a_missing_or_stale_page_is_made_again(self, troubled: Path) -> None:
        page = troubled / "out" / "status.html"
        page.unlink()
        report = reconcile(troubled, ReconcileOptions(clock=_clock))
        assert report.written == ("out/status.html",)
        page.write_text(page.read_text().replace(_digest(troubled), "sha256:0"))
        assert reconcile(troubled, ReconcileOptions(clock=_clock)).written == ("out/status.html",)
        # the report edited by hand: it is repaired, and its page, made from the right one, kept
        status = troubled / "out" / "status.json"
        good = page.read_bytes()
        status.write_bytes(
            status.read_bytes().replace(b'"formatVersion": 1', b'"formatVersion": 2')
        )
        report = reconcile(troubled, ReconcileOptions(clock=_clock))
        assert report.written == ("out/status.json",)
        assert page.read_bytes() == good

    def test_a_watchers_pages_are_the_pages_of_its_reports(self, demo_copy: Path) -> None:
        """Across edits with one cache (as watch): each page is what the pure renderer makes
        of the status.json beside it; the memo rebuilds only the rows that changed."""
        troubled_demo(demo_copy)
        opts = ReconcileOptions(cache=ReconcileCache(), clock=_clock)
        assert opts.cache is not None
        view = None
        logger = demo_copy / "desired" / "apps" / "logger.yaml"
        edits: list[Callable[[], object]] = [
            lambda: None,
            lambda: logger.write_text(logger.read_text().replace("instances: 3", "instances: 5")),
            lambda: (demo_copy / BROKEN_SERVICE).unlink(),
            lambda: logger.write_text(logger.read_text().replace("instances: 5", "instances: 2")),
        ]
        for i, edit in enumerate(edits):
            edit()
            report = reconcile(demo_copy, opts, view)
            view = report.computed.view
            assert report.status() == _status(demo_copy)
            want = render_status_page(_status(demo_copy), made_at=T0, source=_digest(demo_copy))
            assert (demo_copy / "out" / "status.html").read_bytes() == want, i
            if i == 2:  # only the invalid input went: every node row was kept
                assert opts.cache.page.rebuilt == 0


class TestTheRenderer:
    def test_is_pure_and_its_memo_changes_nothing(self) -> None:
        doc = synthetic_status(40, 200)
        memo = PageMemo()
        first = render_status_page(doc, made_at=T0, memo=memo)
        assert first == render_status_page(doc, made_at=T0)
        assert memo.rebuilt == 40
        doc["instances"]["inst-00000007"] = dict(doc["instances"]["inst-00000007"], state="failed")
        doc["nodes"]["node-00003"] = dict(doc["nodes"]["node-00003"], state="paused")
        del doc["nodes"]["node-00039"]
        again = render_status_page(doc, made_at=T0, memo=memo)
        assert memo.rebuilt == 2  # node-00007's instances and node-00003's entry
        assert again == render_status_page(doc, made_at=T0)
        assert again != first and "node-00039" not in again.decode()

    def test_hostile_text_is_escaped(self) -> None:
        doc = synthetic_status(2, 4, n_failures=1)
        doc["failures"][0]["summary"] = '<script>alert("x")</script> & <img src=x>'
        doc["invalidInputs"] = {
            "desired/<b>.yaml": [
                {"path": "x", "line": 1, "col": 1, "severity": "error", "message": "</td><svg>"}
            ]
        }
        page = render_status_page(doc, made_at=T0).decode()
        assert "<script" not in page and "<img" not in page and "</td><svg>" not in page
        assert "&lt;script&gt;alert(&quot;x&quot;)&lt;/script&gt; &amp; &lt;img src=x&gt;" in page

    def test_is_self_contained_and_readable_as_tables(self, troubled: Path) -> None:
        page = (troubled / "out" / "status.html").read_text()
        assert "<script" not in page.lower()
        assert not re.search(r"""(src|href)\s*=\s*["']?(https?:|//)""", page, re.I)
        assert "<link" not in page and "@import" not in page and "url(" not in page
        assert '<html lang="en">' in page and 'name="viewport"' in page
        tables = page.count("<table")
        assert tables >= 4  # unplaceable, alerts, invalid inputs, nodes
        assert page.count("<caption>") == tables
        assert page.count('<th scope="row">') == len(_status(troubled)["nodes"])
        svgs = re.findall(r"<svg[^>]*>", page)
        assert svgs and all('aria-hidden="true"' in s for s in svgs)  # said in words beside
        assert page.count("<details>") == sum(
            1 for n in _status(troubled)["nodes"].values() if n["instances"]
        )

    def test_status_html_writes_the_page_of_the_report(
        self, troubled: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
    ) -> None:
        target = tmp_path / "page.html"
        assert main(["status", "--state", str(troubled), "--html", str(target)]) == 0
        assert f"Wrote {target}" in capsys.readouterr().out
        mtime = (troubled / "out" / "status.json").stat().st_mtime
        assert target.read_bytes() == render_status_page(_status(troubled), made_at=mtime)


def _blank_check(png: bytes, size: tuple[int, int]) -> None:
    image = read_png(png)
    assert (image.width, image.height) == size
    colors = image.pixels()
    _, most = colors.most_common(1)[0]
    drawn = image.width * image.height - most
    assert len(colors) >= 20, f"only {len(colors)} colors: a blank page"
    assert drawn > 0.03 * image.width * image.height, f"{drawn} pixels off the background"
    assert bytes((0x2F, 0x6F, 0xDB)) in colors  # the bars' "reserved" blue is drawn


class TestInChromium:
    def test_a_1280x800_screenshot_is_not_blank(self, troubled: Path, tmp_path: Path) -> None:
        png = screenshot(troubled / "out" / "status.html", tmp_path / "shot.png", (1280, 800))
        _blank_check(png, (1280, 800))

    def test_the_dom_holds_every_node_and_every_unplaceable_instance(self, troubled: Path) -> None:
        dom = dump_dom(troubled / "out" / "status.html")
        doc = _status(troubled)
        for node_id in doc["nodes"]:
            assert f'id="node-{node_id}"' in dom
        assert doc["failures"]
        for f in doc["failures"]:
            assert f["instanceId"] in dom
            assert html.escape(f["summary"], quote=False) in dom

    def test_at_phone_width_nothing_scrolls_sideways(self, troubled: Path, tmp_path: Path) -> None:
        """The page in a 390 px wide frame (a phone; a headless window is at least 500 px
        wide): the probe around it (the page itself has no script) reports that the page is
        no wider than the frame."""
        probe = tmp_path / "probe.html"
        page = (troubled / "out" / "status.html").resolve()
        probe.write_text(
            '<!DOCTYPE html><html><body style="margin:0">'
            f'<iframe id="f" src="{page.as_uri()}" style="width:390px;height:844px;border:0">'
            "</iframe><script>document.getElementById('f').onload = function () {"
            " var d = this.contentDocument.documentElement;"
            " document.body.setAttribute('data-width', d.scrollWidth + '/' + d.clientWidth); }"
            "</script></body></html>"
        )
        dom = dump_dom(probe, (800, 900), "--allow-file-access-from-files")
        widths = re.search(r'data-width="(\d+)/(\d+)"', dom)
        assert widths is not None, dom[-500:]
        scroll, client = int(widths.group(1)), int(widths.group(2))
        assert 300 < client <= 390 and scroll <= client

    @pytest.mark.slow
    def test_a_unit_of_5000_nodes_renders(self, tmp_path: Path) -> None:
        """5,000 nodes x 20,000 instances: the page renders within the time limit (generous:
        a bound on a hang, not a measurement) and holds every node."""
        doc = synthetic_status(5000, 20000)
        page = tmp_path / "big.html"
        page.write_bytes(render_status_page(doc, made_at=T0))
        dom = dump_dom(page, timeout=300)
        for node_id in ("node-00000", "node-02500", "node-04999"):
            assert f'id="node-{node_id}"' in dom
        assert dom.count('<th scope="row">') == 5000
        assert "lost-00049" in dom
