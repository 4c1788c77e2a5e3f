"""The HTML report as a reader's browser shows it: headless Chromium (Debian's chromium, which setup.sh installs)
loads the rendered fixture report offline, runs its inlined Vega runtime, and every chart must be drawn, fit the
page, and leave the console clean (no Vega warning or error, no failed chart)."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

from decode_gap.report.data import files_in_dir, load_bundle
from decode_gap.report.render import render, write_html
from decode_gap.report.sections import build_context
from test_report_render import PAGE_PX  # the widest a chart may be drawn

FIX = Path(__file__).resolve().parent / "fixtures" / "report"
BROWSERS = ("chromium", "chromium-browser", "google-chrome")
# as the machine's closed network needs: no background connections, no sandbox as root, no GPU
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--enable-logging=stderr", "--v=0", "--virtual-time-budget=15000", "--dump-dom"]


def _browser() -> str:
    found = next((shutil.which(b) for b in BROWSERS if shutil.which(b)), None)
    if found is None:
        pytest.skip("no Chromium on this host (setup.sh installs Debian's chromium)")
    return found


@pytest.fixture(scope="module")
def shown(tmp_path_factory):
    browser = _browser()
    tmp = tmp_path_factory.mktemp("browser")
    ctx = build_context(load_bundle(files_in_dir(FIX / "h200x2")), hw_rev="test-rev", fingerprint={})
    page = tmp / "report.html"
    write_html(page, render("report.html.j2", ctx, "html"))
    run = subprocess.run([browser, *FLAGS, f"--user-data-dir={tmp / 'profile'}", page.as_uri()],
                         capture_output=True, text=True, timeout=180)
    if run.returncode != 0 or "<html" not in run.stdout:
        pytest.fail(f"{browser} did not load the report (exit {run.returncode}): {run.stderr[-500:]}")
    return run.stdout, run.stderr, ctx


def test_every_chart_is_drawn(shown):
    dom, _, ctx = shown
    ids = [c["id"] for c in ctx["charts"] if c.get("spec")]
    assert len(ids) >= 12
    for chart_id in ids:
        m = re.search(rf'<div[^>]*id="{chart_id}"[^>]*>(.*?)</svg>', dom, re.S)
        assert m and "<svg" in m.group(1), f"{chart_id} not drawn"
        width = float(re.search(r'<svg[^>]*width="([0-9.]+)"', m.group(1)).group(1))
        assert width <= PAGE_PX, f"{chart_id} is {width} px wide"
    assert not re.search(r">chart failed: ", dom)  # vega-embed's failure text in a chart's element


def test_the_console_is_clean(shown):
    _, log, _ = shown
    console = [line for line in log.splitlines() if ":CONSOLE" in line]
    assert console == []
