"""The dashboard in headless Chromium: sign in with the token field, see the demo run in the
list, open it, find the stage table and the SVG charts, and save screenshots to
tests/artifacts/. Shares the server and the demo run with tests/test_service.py.

Needs /usr/bin/chromium and /usr/bin/chromedriver (Debian: apt-get install chromium
chromium-driver) and the selenium package; skips, naming what is missing, without them.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from conftest import REPO
from test_service import TOKEN, shared_demo_run, shared_service

CHROMIUM = Path("/usr/bin/chromium")
CHROMEDRIVER = Path("/usr/bin/chromedriver")
ARTIFACTS = REPO / "tests" / "artifacts"
_missing = [str(p) for p in (CHROMIUM, CHROMEDRIVER) if not p.exists()]
pytestmark = pytest.mark.skipif(bool(_missing), reason=f"{' and '.join(_missing)} not found: "
                                "apt-get install -y chromium chromium-driver")
webdriver = pytest.importorskip("selenium.webdriver", reason="selenium is not installed (pip install selenium)")

from selenium.webdriver.chrome.options import Options  # noqa: E402
from selenium.webdriver.chrome.service import Service as ChromeService  # noqa: E402
from selenium.webdriver.common.by import By  # noqa: E402
from selenium.webdriver.support import expected_conditions as EC  # noqa: E402
from selenium.webdriver.support.ui import WebDriverWait  # noqa: E402

FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
         "--disable-component-update", "--disable-sync", "--disable-quic", "--no-first-run",
         "--disable-dev-shm-usage", "--window-size=1280,2200"]


@pytest.fixture(scope="module")
def service(tmp_path_factory, request):
    return shared_service(tmp_path_factory, request)


@pytest.fixture(scope="module")
def demo(service):
    return shared_demo_run(service)


@pytest.fixture(scope="module")
def browser(tmp_path_factory):
    os.environ.setdefault("SE_AVOID_STATS", "true")  # no Selenium Manager telemetry
    opts = Options()
    opts.binary_location = str(CHROMIUM)
    for flag in FLAGS + [f"--user-data-dir={tmp_path_factory.mktemp('chromium-profile')}"]:
        opts.add_argument(flag)
    opts.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(service=ChromeService(executable_path=str(CHROMEDRIVER)), options=opts)
    driver.set_page_load_timeout(60)
    yield driver
    driver.quit()


def _wait(browser, timeout: float = 30) -> WebDriverWait:
    return WebDriverWait(browser, timeout)


def _js_errors(browser) -> list[str]:
    return [e["message"] for e in browser.get_log("browser") if e["level"] == "SEVERE"]


def test_dashboard_lists_the_demo_run_and_shows_its_stage_table_and_charts(service, demo, browser):
    from curation.pipeline.stats import stage_table

    ARTIFACTS.mkdir(exist_ok=True)
    run_id = demo["id"]
    browser.get(service.url + "/")
    # signed out: the sign-in form, then the token field
    field = _wait(browser).until(EC.presence_of_element_located((By.ID, "token")))
    field.send_keys(TOKEN)
    browser.find_element(By.ID, "login-submit").click()
    _js_errors(browser)  # drain: the signed-out page itself was an expected 401

    row = _wait(browser).until(EC.presence_of_element_located((By.CSS_SELECTOR, f'tr[data-run-id="{run_id}"]')))
    assert row.find_element(By.CSS_SELECTOR, ".badge").text == "done"
    assert row.find_element(By.CSS_SELECTOR, "svg.bar")  # the progress bar
    assert browser.find_element(By.CSS_SELECTOR, 'tr[data-run-id="signals"]')  # a run made by the CLI
    browser.save_screenshot(str(ARTIFACTS / "dashboard-runs.png"))

    row.find_element(By.CSS_SELECTOR, "a.run-link").click()
    expected = stage_table(demo["run_dir"])
    _wait(browser).until(lambda b: len(b.find_elements(By.CSS_SELECTOR, "#stage-table tbody tr")) == len(expected))
    for r in expected:
        cells = browser.find_element(By.CSS_SELECTOR, f'#stage-table tr[data-stage="{r["stage"]}"]') \
            .find_elements(By.TAG_NAME, "td")
        assert [c.text for c in cells[2:6]] == [f"{r[k]:,}" for k in ("shards", "docs_in", "kept", "rejected")]
    chart = browser.find_element(By.CSS_SELECTOR, "svg.chart#chart-stages")
    assert len(chart.find_elements(By.CSS_SELECTOR, "rect.bar-kept")) == len(expected)
    assert browser.find_element(By.CSS_SELECTOR, "svg.chart#chart-sources")
    assert browser.find_elements(By.CSS_SELECTOR, "#reasons-table tbody tr")
    browser.save_screenshot(str(ARTIFACTS / "dashboard-run.png"))

    # the SQL box answers from the run
    browser.find_element(By.CSS_SELECTOR, "#sql-form button").click()
    _wait(browser).until(EC.presence_of_element_located((By.CSS_SELECTOR, "#sql-result table.sql tbody tr")))
    assert _js_errors(browser) == []


def test_histogram_charts_appear_when_the_columns_exist(service, demo, browser):
    browser.get(f"{service.url}/#/runs/signals")
    hist = _wait(browser).until(EC.presence_of_element_located((By.CSS_SELECTOR, "svg.chart#chart-quality")))
    assert len(hist.find_elements(By.CSS_SELECTOR, "rect.bar-main")) == 20
    langs = browser.find_element(By.CSS_SELECTOR, "svg.chart#chart-languages")
    assert {t.text for t in langs.find_elements(By.CSS_SELECTOR, "text.label")} == {"en", "de", "fr"}
    assert browser.find_element(By.CSS_SELECTOR, "svg.chart#chart-tokens")
    browser.save_screenshot(str(ARTIFACTS / "dashboard-signals.png"))
    assert _js_errors(browser) == []
