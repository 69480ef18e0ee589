"""The explorer page in a real browser (headless Chromium via selenium): type a prompt, see the map drawn, hover a
cell and read the weight the API returned, switch head and layer, append a token, save the view as standalone
HTML and open it with the server gone; no console error. Skipped, with the reason, without Chromium."""
from __future__ import annotations

import json
import re

import pytest
import torch

import explore
from tests.test_explore import PROMPT, char_tok, post, serve, tiny_run  # noqa: F401 (fixture)
from viz.explorer.screenshot import chromium_driver, missing_browser, wait_for_map

pytestmark = [pytest.mark.slow, pytest.mark.skipif(missing_browser() is not None,
                                                   reason=f"no headless browser: {missing_browser()}")]


@pytest.fixture
def driver():
    d = chromium_driver()
    yield d
    d.quit()


def hover(driver, canvas_id: str, q: int, k: int) -> str:
    """Move the mouse over cell (query q, key k) of a heat map; the tooltip's text."""
    from selenium.webdriver.common.action_chains import ActionChains
    canvas = driver.find_element("id", canvas_id)
    driver.execute_script("arguments[0].scrollIntoView({block: 'center', inline: 'center'})", canvas)
    d = driver.execute_script("const c = arguments[0]; return [+c.dataset.origin, +c.dataset.cell, c.width, "
                              "c.height, c.clientWidth];", canvas)
    origin, cell, w, h, shown = d
    assert shown == w  # drawn at its own size: canvas pixels are CSS pixels
    x, y = origin + (k + 0.5) * cell - w / 2, origin + (q + 0.5) * cell - h / 2  # offsets from the centre
    ActionChains(driver).move_to_element_with_offset(canvas, int(x), int(y)).perform()
    tip = driver.find_element("id", "tooltip")
    assert tip.is_displayed()
    return tip.text


def weight_in(text: str) -> float:
    return float(re.search(r"weight (-?[0-9.]+)", text).group(1))


def console_errors(driver) -> list[str]:
    return [e["message"] for e in driver.get_log("browser") if e["level"] == "SEVERE"]


def test_page_end_to_end(tmp_path, char_tok, driver):
    views = explore.load_views([("run", str(tiny_run(tmp_path / "run", char_tok)))], torch.device("cpu"))
    with serve(views) as url:
        driver.get(url + "/")
        box = driver.find_element("id", "prompt")
        box.send_keys(PROMPT)
        wait_for_map(driver)
        T = len(PROMPT)
        assert len(driver.find_elements("css selector", "#chips .chip")) == T
        assert len(driver.find_elements("css selector", "#heads canvas")) == 2

        api = post(url, {"text": PROMPT})[1]["attention"]  # [layer][head][query][key]
        text = hover(driver, "map", 5, 3)
        assert text.startswith("query 5 “:”") and "key 3 “E”" in text, text
        assert f"{weight_in(text):.6f}" == f"{api[0][0][5][3]:.6f}"
        assert "masked" in hover(driver, "map", 3, 7)

        from selenium.webdriver.support.ui import Select, WebDriverWait
        Select(driver.find_element("id", "head")).select_by_value("1")
        assert f"{weight_in(hover(driver, 'map', 10, 4)):.6f}" == f"{api[0][1][10][4]:.6f}"
        Select(driver.find_element("id", "layer")).select_by_value("2")
        WebDriverWait(driver, 30).until(lambda d: d.find_element("id", "map").get_attribute("data-layer") == "2")
        assert f"{weight_in(hover(driver, 'map', T - 1, 0)):.6f}" == f"{api[2][1][T - 1][0]:.6f}"
        assert f"{weight_in(hover(driver, 'softmax', T - 1, 5)):.6f}" == f"{api[2][1][T - 1][5]:.6f}"
        driver.find_element("css selector", "#heads figure:nth-child(1)").click()  # a thumbnail: enlarged
        assert driver.find_element("id", "map").get_attribute("data-head") == "0"

        top = post(url, {"text": PROMPT})[1]["next"][0]
        driver.find_element("id", "append").click()  # the highlighted bar: the likeliest token
        WebDriverWait(driver, 30).until(lambda d: d.execute_script("return S.ids.length") == T + 1)
        wait_for_map(driver)
        assert driver.execute_script("return S.ids")[-1] == top["id"]
        assert len(driver.find_elements("css selector", "#chips .chip")) == T + 1
        assert box.get_attribute("value") == PROMPT + top["token"]
        assert console_errors(driver) == []

        png = driver.execute_async_script(  # a panel's PNG button: one PNG of its canvases
            "const done = arguments[0], orig = Draw.download; Draw.download = (b, name) => { Draw.download = orig;"
            "  b.arrayBuffer().then(a => done([name, b.type, [...new Uint8Array(a, 0, 4)]])); };"
            "document.querySelector('#three-steps button.png').click();")
        assert png == ["three-steps.png", "image/png", [0x89, 0x50, 0x4E, 0x47]]
        html = driver.execute_script(  # the standalone file's text, as saveHTML builds it
            "const orig = Draw.download; let out = null; Draw.download = b => { out = b; };"
            "await saveHTML(); Draw.download = orig; return await out.text();")
        driver.find_element("id", "temperature")  # still the live page
        box.send_keys("世")  # outside the vocabulary: one error line, the page keeps its map
        WebDriverWait(driver, 30).until(lambda d: d.find_element("id", "error").is_displayed())
        assert "characters not in the vocabulary: '世'" in driver.find_element("id", "error").text
        assert all("status of 400" in e for e in console_errors(driver))  # the refused request, nothing else
    saved = tmp_path / "view.html"
    saved.write_text(html, encoding="utf-8")
    assert "http://" not in html and "https://" not in html
    driver.get(saved.as_uri())  # the server is gone: everything it needs is in the file
    wait_for_map(driver)
    assert driver.execute_script("return S.snapshot && S.ids.length") == T + 1
    assert json.loads(driver.execute_script("return JSON.stringify([S.layer, S.head])")) == [2, 0]
    assert "weight" in hover(driver, "map", T, 0)
    assert console_errors(driver) == []
