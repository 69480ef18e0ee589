"""The explorer page in a real browser (headless Chromium via selenium): type a prompt, see the map drawn, hover a
cell and read the weight the API returned, switch head and layer, append a token, save the view as standalone
HTML and open it with the server gone; no console error. The logit lens grid and its hover, and a run's probe
snapshots under the step slider and the play button. Saved files open whatever markup the prompt holds, the
box keeps the exact text when GPT-2 tokens split a character, and two models' tokens and maps always agree.
Skipped, with the reason, without Chromium."""
from __future__ import annotations

import json
import re

import pytest
import torch

import explore
from viz.explorer.model_view import load_views
from tests.test_explore import PROMPT, char_tok, post, serve, tiny_run  # noqa: F401 (fixture)
from viz.explorer.screenshot import chromium_driver, missing_browser, wait_for_map

pytestmark = [pytest.mark.slow, pytest.mark.skipif(missing_browser() is not None,
                                                   reason=f"no headless browser: {missing_browser()}")]


@pytest.fixture(scope="module")
def browser():
    d = chromium_driver()  # one browser for the module's tests (it takes seconds to start); each loads its page
    yield d
    d.quit()


@pytest.fixture
def driver(browser):
    browser.get_log("browser")  # (drained: what an earlier test's pages logged)
    yield browser


def type_prompt(driver, text: str) -> None:
    """Type `text` over the box's (the page starts with a prompt), as a user does; until its map is drawn."""
    from selenium.webdriver.common.keys import Keys
    from selenium.webdriver.support.ui import WebDriverWait
    WebDriverWait(driver, 30).until(lambda d: d.execute_script("return S.info !== null"))
    driver.find_element("id", "prompt").send_keys(Keys.CONTROL, "a")
    driver.find_element("id", "prompt").send_keys(text)
    WebDriverWait(driver, 30).until(lambda d: d.execute_script("return S.tokens.join('')") == text)
    wait_for_map(driver)


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
    views = load_views([("run", str(tiny_run(tmp_path / "run", char_tok)))], torch.device("cpu"))
    with serve(views) as url:
        driver.get(url + "/")
        box = driver.find_element("id", "prompt")
        type_prompt(driver, PROMPT)
        T = len(PROMPT)
        assert len(driver.find_elements("css selector", "#chips .chip")) == T
        assert len(driver.find_elements("css selector", "#heads canvas")) == 2
        assert not driver.find_element("id", "timeline").is_displayed()  # a run without probe snapshots

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

        minp = driver.find_element("id", "minp")  # the min-p box: the bars are the API's `next` with min_p
        minp.clear()
        minp.send_keys("0.5")
        bars = driver.execute_script("return NEXT.map(n => [n.id, n.prob])")
        near_top = post(url, {"text": PROMPT, "min_p": 0.5})[1]["next"]
        assert [i for i, _ in bars] == [n["id"] for n in near_top] and len(bars) < 20
        assert all(abs(p - n["prob"]) < 1e-6 for (_, p), n in zip(bars, near_top))
        minp.clear()
        minp.send_keys("0")
        assert driver.execute_script("return NEXT.length") == 20

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
    assert len(driver.find_elements("css selector", "#lens td")) == 4 * (T + 1)  # the lens is saved too
    assert console_errors(driver) == []


def show(driver, text: str) -> None:
    """Put `text` in the prompt box and run it, as typing does (without the wait, and with any character)."""
    from selenium.webdriver.support.ui import WebDriverWait
    WebDriverWait(driver, 30).until(lambda d: d.execute_script("return S.info !== null"))  # the page has started
    error = driver.execute_async_script(
        "const done = arguments[1]; $('prompt').value = arguments[0];"
        "runTokens({text: arguments[0]}).then(() => done(null), e => done(e.message));", text)
    assert error is None, error


def saved_html(driver) -> str:
    return driver.execute_script("const orig = Draw.download; let out = null; Draw.download = b => { out = b; };"
                                 "await saveHTML(); Draw.download = orig; return await out.text();")


HOSTILE = ["a <!--<script> b", "</script><script>x=1</script>", "<!--", "<script>", "</style><!--",
           "x\u2028y\u2029z", "--> ]]> <![CDATA[ &amp; &lt;", "${x}`\\u003c\\x3C'\"", "<!-- <script> --> </script>"]


def test_saved_html_opens_whatever_the_prompt_holds(tmp_path, tiny_corpus, driver):
    """Text that changes how the HTML parser reads a script (a comment opener and a script tag) in the prompt, the
    tokens and the model's name: each saved file opens offline and shows the map."""
    from data.tokenizer import CharTokenizer
    tok = CharTokenizer(tiny_corpus.read_text() + "".join(HOSTILE))
    run = tiny_run(tmp_path / "run <!--<script>", tok)
    views = load_views([("run", str(run))], torch.device("cpu"))
    files = []
    with serve(views) as url:
        driver.get(url + "/")
        for i, text in enumerate(HOSTILE):
            show(driver, text)
            files.append(tmp_path / f"view{i}.html")
            files[-1].write_text(saved_html(driver), encoding="utf-8")
    for text, path in zip(HOSTILE, files):
        driver.get(path.as_uri())
        wait_for_map(driver)
        assert driver.execute_script("return [S.snapshot, S.tokens.join(''), $('prompt').value, "
                                     "S.info.models[0].name]") == [True, text, text, views[0].name]
        assert console_errors(driver) == []


def test_append_keeps_the_exact_text_when_tokens_split_a_character(tmp_path, cache_with_gpt2, driver):
    """GPT-2 BPE cuts an emoji or CJK character into byte tokens: the box holds the exact text the ids make (never
    the chips' escapes such as \\xf0\\x9f), the text before a character still incomplete, and typing on re-tokenizes
    that exact text."""
    from data.tokenizer import GPT2Tokenizer
    tok = GPT2Tokenizer()
    views = load_views([("run", str(tiny_run(tmp_path / "run", tok)))], torch.device("cpu"))
    prompt, emoji = "日本 😀", tok.encode("😀")
    assert len(emoji) > 1  # its 4 bytes in byte tokens: the first ones end inside the character
    with serve(views) as url:
        driver.get(url + "/")
        show(driver, prompt)
        append = "const done = arguments[1]; append(arguments[0]).then(() => done($('prompt').value));"
        assert driver.execute_script("return S.ids") == tok.encode(prompt)
        assert driver.execute_async_script(append, tok.encode("!")[0]) == prompt + "!"
        for n, i in enumerate(emoji, 1):  # the text before the emoji until its last byte is there
            assert driver.execute_async_script(append, i) == prompt + ("!😀" if n == len(emoji) else "!")
        assert driver.execute_script("return S.ids") == tok.encode(prompt) + tok.encode("!") + emoji
        from selenium.webdriver.common.keys import Keys
        from selenium.webdriver.support.ui import WebDriverWait
        driver.find_element("id", "prompt").send_keys(Keys.END, "?")  # typing on: the exact text, re-tokenized
        text = prompt + "!😀?"
        WebDriverWait(driver, 30).until(lambda d: d.execute_script("return S.ids") == tok.encode(text))
        assert console_errors(driver) == []


def test_two_models_tokens_and_maps_always_agree(tmp_path, char_tok, driver):
    """A text that fits A's context but not B's: the error names B, and the page keeps the tokens its maps are for."""
    from selenium.webdriver.support.ui import Select, WebDriverWait
    a, b = tiny_run(tmp_path / "a", char_tok, seed=1, block_size=48), tiny_run(tmp_path / "b", char_tok, seed=2)
    views = load_views([("run", str(a)), ("run", str(b))], torch.device("cpu"))
    with serve(views) as url:
        driver.get(url + "/")
        box = driver.find_element("id", "prompt")
        type_prompt(driver, PROMPT)
        box.send_keys("e" * 15)  # 38 characters: A's context is 48, B's 32
        WebDriverWait(driver, 30).until(lambda d: d.find_element("id", "error").is_displayed())
        assert driver.find_element("id", "error").text == ("error: model B: the text is 38 tokens, longer than the "
                                                           "model's context of 32: shorten it")
        Select(driver.find_element("id", "head")).select_by_value("1")  # a redraw: of the tokens the maps are for
        T = len(PROMPT)
        assert driver.execute_script("return [S.ids.length, S.tokens.length, "
                                     "S.models.map(m => m.layers.get(0).att.length), +$('map').dataset.t, "
                                     "document.querySelectorAll('#chips .chip').length]") == [T, T, [2 * T * T] * 2,
                                                                                              T, T]
        assert all("status of 400" in e for e in console_errors(driver))
        # a layer asked for the old tokens, answered after the new ones were taken: not stored with them
        T = len("ROMEO")
        assert driver.execute_async_script("""
          const done = arguments[0], orig = fetchLayers, late = [];
          fetchLayers = (i, body) => body.logits ? orig(i, body) : new Promise(r => late.push(() => r(orig(i, body))));
          S.models.forEach(m => m.layers.delete(1));
          S.layer = 1;
          const running = runTokens({text: "ROMEO"}), pending = ensureLayer();  // a layer asked while typing
          await running;
          late.forEach(go => go());
          await pending;
          fetchLayers = orig;
          done([S.ids.length, S.models.map(m => [...m.layers.values()].map(l => l.att.length))]);""") == [
            T, [[2 * T * T] * 3, [2 * T * T] * 3]]


def lens_hover(driver, cell) -> str:
    from selenium.webdriver.common.action_chains import ActionChains
    driver.execute_script("arguments[0].scrollIntoView({block: 'center', inline: 'center'})", cell)
    ActionChains(driver).move_to_element(cell).perform()
    return driver.find_element("id", "tooltip").text


def test_lens_grid_and_the_training_timeline(tmp_path, char_tok, driver):
    """The lens grid of the typed text (top tokens, the top 5 on hover, as /api/lens says), and a run's snapshots:
    the slider shows a step's lens and map, play goes through every step from the first."""
    from selenium.webdriver.support.ui import WebDriverWait
    from tests.helpers import tiny_model
    from training.probe import ProbeRecorder
    run = tiny_run(tmp_path / "run", char_tok)
    from viz import probes
    recorder = ProbeRecorder(run, "ROMEO:\nThe", char_tok.encode("ROMEO:\nThe"), char_tok.vocab_size, writes=True)
    for step in (0, 10, 20):  # a different model at each step, as training makes
        recorder.record(tiny_model(char_tok.vocab_size + 3, step, n_layer=3, block_size=32), step, 4 - step / 10)
    views = load_views([("run", str(run))], torch.device("cpu"))
    with serve(views) as url:
        driver.get(url + "/")
        show(driver, PROMPT)
        wait_for_map(driver)
        T, lens = len(PROMPT), post(url, {"text": PROMPT}, "/api/lens")[1]["lens"]
        rows = driver.find_elements("css selector", "#lens tr")
        assert len(rows) == 1 + 4 and rows[1].text.startswith("embedding") and rows[4].text.startswith("layer 2")
        cells = driver.find_elements("css selector", "#lens td")
        assert [c.text for c in cells[-T:]] == [cell_text(c[0]["token"]) for c in lens[3]]
        tip = lens_hover(driver, cells[-1]).splitlines()
        assert tip[0] == f"layer 2 (output) at {T - 1} “d”: next" and len(tip) == 6
        assert tip[1:] == [f"“{cell_text(c['token'])}” {100 * c['prob']:.1f}%" for c in lens[3][T - 1]]

        timeline = driver.find_element("id", "timeline")
        WebDriverWait(driver, 30).until(lambda d: d.find_element("id", "tl-map").get_attribute("data-step") == "20")
        assert timeline.is_displayed() and "step 20 · val loss 2.0000 · head 0" in timeline.text
        driver.execute_script("$('tl-slider').value = 0; $('tl-slider').dispatchEvent(new Event('input'))")
        WebDriverWait(driver, 30).until(lambda d: d.find_element("id", "tl-map").get_attribute("data-step") == "0")
        assert "step 0 · val loss 4.0000 · head 0" in timeline.text
        first = probes.read_snapshot(run, 0)["lens_ids"][3].tolist()  # the last layer's top ids at step 0
        cells = driver.find_elements("css selector", "#tl-lens td")
        assert [c.text for c in cells[-10:]] == [cell_text(char_tok.decode([ids[0]])) for ids in first]
        assert lens_hover(driver, cells[-1]).startswith("layer 2 (output) at 9 “e”: next")
        assert len(driver.find_elements("css selector", "#tl-heads canvas")) == 2

        # the steps drawn (a step not loaded yet is drawn blank first)
        driver.execute_script("window.seen = []; const draw = renderTimeline;"
                              "renderTimeline = () => { draw(); const s = $('tl-map').dataset.step;"
                              "  if (s !== undefined) seen.push(+s); };"
                              "$('tl-slider').value = 2; showStep(2).then(() => $('play').click());")
        WebDriverWait(driver, 30).until(lambda d: d.execute_script("return !TL.playing && seen.length > 1"))
        seen = driver.execute_script("return seen")
        assert seen[0] == 20 and seen[-3:] == [0, 10, 20], seen  # from the end, play starts over at step 0
        assert driver.find_element("id", "play").text == "play"
        assert console_errors(driver) == []


def cell_text(token: str) -> str:
    """The page's cell text: whitespace made visible (draw.js's Draw.visible), at most 6 characters."""
    v = token.replace("\n", "⏎").replace("\t", "⇥").replace(" ", "·") or "∅"
    return v if len(v) <= 6 else v[:5] + "…"


def probed_run(path, tok, n_layer: int = 3):
    """A tiny run with probe snapshots, as training records them: at steps 30 and 60 with the step's
    train loss, at 90 (an evaluation) with the val loss; of models of n_layer layers (the run's own
    model has 3)."""
    from tests.helpers import tiny_model
    from training.probe import ProbeRecorder
    run = tiny_run(path, tok)
    recorder = ProbeRecorder(run, "ROMEO:\nThe", tok.encode("ROMEO:\nThe"), tok.vocab_size, writes=True)
    for step, loss in ((30, {"train_loss": 3.5}), (60, {"train_loss": 2.75}), (90, {"val_loss": 2.0})):
        model = tiny_model(tok.vocab_size + 3, step, n_layer=n_layer, block_size=32)
        recorder.record(model, step, **loss)
    return run


def first_load(driver, url: str, text: str | None = None) -> None:
    """Open the page (and show `text`, else type nothing); until its map and its timeline (at the last step) are
    drawn."""
    from selenium.webdriver.support.ui import WebDriverWait
    driver.get(url + "/")
    if text is not None:
        show(driver, text)
    WebDriverWait(driver, 15).until(lambda d: d.execute_script("return S.ids.length > 0"))
    wait_for_map(driver)
    WebDriverWait(driver, 30).until(lambda d: d.find_element("id", "tl-map").get_attribute("data-step") == "90")


def pixel(driver, canvas_id: str, x: float, y: float) -> list[int]:
    return driver.execute_script("return [...$(arguments[0]).getContext('2d').getImageData(arguments[1], arguments[2],"
                                 " 1, 1).data].slice(0, 3)", canvas_id, x, y)


def test_the_first_load_shows_every_panel(tmp_path, char_tok, driver):
    """Nothing typed: the page starts with the run's probe text (the timeline's), so every panel shows something at
    once: the chips, the map and the three steps, the heads, the next-token bars, the lens and the timeline."""
    views = load_views([("run", str(probed_run(tmp_path / "run", char_tok)))], torch.device("cpu"))
    with serve(views) as url:
        first_load(driver, url)
        text = "ROMEO:\nThe"
        assert driver.find_element("id", "prompt").get_attribute("value") == text
        assert len(driver.find_elements("css selector", "#chips .chip")) == len(text)
        assert driver.execute_script("return ['map', 'scores', 'masked', 'softmax'].map(id => +$(id).dataset.t)") == \
            [len(text)] * 4
        assert len(driver.find_elements("css selector", "#heads canvas")) == 2
        assert driver.execute_script("return NEXT.length") == 20
        assert len(driver.find_elements("css selector", "#lens td")) == 4 * len(text)
        assert driver.find_element("id", "timeline").is_displayed()
        assert console_errors(driver) == []


def test_maps_and_the_lens_have_a_colour_key(tmp_path, char_tok, driver):
    """Each map's canvas carries its key (so its PNG does too): weights from 0 (viridis' purple, the bottom) to 1 (its
    yellow, the top), each tick at the colour that weight gets, square-root scale or not; scores and differences from
    -scale (blue) to +scale (red); the lens grids say their colour is the top token's probability."""
    views = load_views([("run", str(probed_run(tmp_path / "run", char_tok)))], torch.device("cpu"))
    with serve(views) as url:
        first_load(driver, url, PROMPT)

        def key(canvas_id):
            return driver.execute_script("const d = $(arguments[0]).dataset; return [+d.keyX + 6, +d.keyTop, "
                                         "+d.keyBar, d.ticks.split(' ').map(Number)]", canvas_id)

        for canvas_id, ticks in (("map", [0, 0.05, 0.2, 0.5, 1]), ("tl-map", [0, 0.05, 0.2, 0.5, 1]),
                                 ("softmax", [0, 0.25, 0.5, 0.75, 1])):
            x, top, bar, shown = key(canvas_id)
            assert shown == ticks, canvas_id
            assert pixel(driver, canvas_id, x, top) == [253, 231, 37] and \
                pixel(driver, canvas_id, x, top + bar - 1) == [68, 1, 84]
        x, top, bar, _ = key("map")
        at = pixel(driver, "map", x, top + round((1 - 0.2 ** 0.5) * (bar - 1)))  # the 0.2 tick, on the sqrt scale
        want = driver.execute_script("const c = document.createElement('canvas'); Draw.heatmap(c, [0.2], 1, "
                                     "{kind: 'weights', sqrt: true, key: false}); return [...c.getContext('2d')"
                                     ".getImageData(5, 5, 1, 1).data].slice(0, 3)")  # a one-cell map of weight 0.2
        assert max(abs(a - b) for a, b in zip(at, want)) <= 4, (at, want)
        driver.find_element("id", "sqrt").click()  # off: the map's key goes linear
        assert key("map")[3] == [0, 0.25, 0.5, 0.75, 1]
        for canvas_id in ("scores", "masked"):
            x, top, bar, ticks = key(canvas_id)
            scale = float(driver.find_element("id", canvas_id).get_attribute("data-scale"))
            assert ticks[0] == -ticks[-1] and ticks[-1] == pytest.approx(scale, rel=0.05) and ticks[2] == 0
            assert pixel(driver, canvas_id, x, top) == [178, 24, 43] and \
                pixel(driver, canvas_id, x, top + bar - 1) == [58, 103, 204]
        for grid in ("lens", "tl-lens"):
            assert driver.find_element("css selector", f"#{grid} .key").text == \
                "colour: the top token's probability, 0 1"
        assert console_errors(driver) == []


def test_the_loss_chart_spans_the_snapshots_and_says_which_loss(tmp_path, char_tok, driver):
    """Snapshots at steps 30 and 60 (the step's train loss) and 90 (an evaluation's val loss): the chart's steps run
    from 30 to 90, not from 0, its losses from 2.0 to 3.5, so step 30's point is the top left corner; the status
    line says which loss a step has."""
    views = load_views([("run", str(probed_run(tmp_path / "run", char_tok)))], torch.device("cpu"))
    with serve(views) as url:
        first_load(driver, url, PROMPT)
        assert driver.execute_script("const d = $('tl-curve').dataset; return [d.x0, d.x1, d.y0, d.y1]") == \
            ["30", "90", "2", "3.5"]
        assert pixel(driver, "tl-curve", 36, 10) == [31, 119, 180]  # the train loss series' colour
        timeline = driver.find_element("id", "timeline")
        assert "step 90 · val loss 2.0000 · head 0" in timeline.text
        driver.execute_script("$('tl-slider').value = 0; $('tl-slider').dispatchEvent(new Event('input'))")
        from selenium.webdriver.support.ui import WebDriverWait
        WebDriverWait(driver, 30).until(lambda d: d.find_element("id", "tl-map").get_attribute("data-step") == "30")
        assert "step 30 · train loss 3.5000 (the step's batch) · head 0" in timeline.text
        assert console_errors(driver) == []



# ---------------------------------------------------------------- every panel shows its selection
def blank(driver, canvas_id: str) -> bool:
    """Whether a canvas is blank: every pixel cleared, and nothing on it to hover."""
    return driver.execute_script(
        "const c = $(arguments[0]);"
        "const d = c.getContext('2d').getImageData(0, 0, c.width, c.height).data;"
        "for (let i = 0; i < d.length; i++) if (d[i] !== 0) return false;"
        "return 'blank' in c.dataset && c.dataset.t === undefined;", canvas_id)


def caption(driver, canvas_id: str) -> str:
    return driver.execute_script("return $(arguments[0] + '-caption').textContent", canvas_id)


def shown(driver, canvas_id: str) -> list | None:
    """[layer, head] a drawn map says it shows (None: blank)."""
    return driver.execute_script("const d = $(arguments[0]).dataset;"
                                 "return 'blank' in d ? null : [+d.layer, +d.head]", canvas_id)


def select(driver, name: str, value: int) -> None:
    from selenium.webdriver.support.ui import Select
    Select(driver.find_element("id", name)).select_by_value(str(value))


def slide_to(driver, i: int) -> None:
    """Move the timeline's step slider to its i-th step."""
    driver.execute_script("$('tl-slider').value = arguments[0];"
                          "$('tl-slider').dispatchEvent(new Event('input'))", i)


def wait_for_step(driver, step: int) -> None:
    from selenium.webdriver.support.ui import WebDriverWait
    WebDriverWait(driver, 30).until(
        lambda d: d.find_element("id", "tl-map").get_attribute("data-step") == str(step))


def test_the_compare_panels_show_their_selection_or_are_blank(tmp_path, char_tok, driver):
    """A has 4 layers of 4 heads, B 2 of 2: a layer or head B lacks leaves B's map and A − B
    blank, captioned why (not the last selection's pictures, nothing to hover); a selection both
    have draws B's own weights and the difference."""
    from selenium.webdriver.common.action_chains import ActionChains
    from selenium.webdriver.support.ui import WebDriverWait
    a = tiny_run(tmp_path / "a", char_tok, seed=1, n_layer=4, n_head=4)
    b = tiny_run(tmp_path / "b", char_tok, seed=2, n_layer=2, n_head=2)
    views = load_views([("run", str(a)), ("run", str(b))], torch.device("cpu"))
    with serve(views) as url:
        driver.get(url + "/")
        show(driver, PROMPT)
        wait_for_map(driver)
        select(driver, "layer", 1)
        select(driver, "head", 1)
        assert [shown(driver, c) for c in ("map", "map-b", "diff")] == [[1, 1]] * 3
        lacks = ((3, 1, "B has no layer 3"), (3, 3, "B has no layer 3"), (1, 3, "B has no head 3"))
        for layer, head, why in lacks:
            select(driver, "layer", layer)
            WebDriverWait(driver, 30).until(lambda d: shown(d, "map")[0] == layer)
            select(driver, "head", head)
            # A has it, B not
            assert shown(driver, "map") == [layer, head]
            assert blank(driver, "map-b") and blank(driver, "diff")
            assert why in caption(driver, "map-b") and why in caption(driver, "diff")
            ActionChains(driver).move_to_element(driver.find_element("id", "map-b")).perform()
            assert not driver.find_element("id", "tooltip").is_displayed()
        # layer 1 head 0: B's own map again, and the difference
        select(driver, "head", 0)
        assert [shown(driver, c) for c in ("map", "map-b", "diff")] == [[1, 0]] * 3
        assert caption(driver, "map-b") == f"B: {views[1].name}"
        assert caption(driver, "diff").startswith("A − B (")
        b_att = post(url, {"text": PROMPT, "model": 1})[1]["attention"]
        a_att = post(url, {"text": PROMPT})[1]["attention"]
        assert f"{weight_in(hover(driver, 'map-b', 7, 2)):.6f}" == f"{b_att[1][0][7][2]:.6f}"
        diff = float(re.search(r"A − B (-?[0-9.]+)", hover(driver, "diff", 7, 2)).group(1))
        assert diff == pytest.approx(a_att[1][0][7][2] - b_att[1][0][7][2], abs=2e-6)
        assert console_errors(driver) == []


A_PANELS = ("map", "scores", "masked", "softmax")

# The page loads one layer at a time (as for a large model); a layer's own request waits for
# release(false), or fails with release(true).
HOLD_LAYERS = """
layersToLoad = (i, T) => (S.layer < S.info.models[i].n_layer ? [S.layer] : []);
const orig = fetchLayers;
window.held = [];
fetchLayers = (i, body) => body.logits ? orig(i, body) : new Promise((ok, fail) => held.push(
  bad => (bad ? fail(new Error('the server went away')) : ok(orig(i, body)))));
window.release = bad => { held.splice(0).forEach(go => go(bad)); };
"""


def test_a_layer_loading_or_not_saved_leaves_every_map_blank(tmp_path, char_tok, driver):
    """As for a model too large to load every layer at once (the page loads the one shown): while
    the layer chosen loads, when it fails, and in a saved page that never loaded it, the map, the
    three steps and the heads are blank and say so, never the previous layer's; once loaded they
    show it."""
    from selenium.webdriver.support.ui import WebDriverWait
    views = load_views([("run", str(tiny_run(tmp_path / "run", char_tok)))], torch.device("cpu"))
    with serve(views) as url:
        driver.get(url + "/")
        WebDriverWait(driver, 30).until(lambda d: d.execute_script("return S.info !== null"))
        driver.execute_script(HOLD_LAYERS)
        show(driver, PROMPT)
        wait_for_map(driver)
        assert driver.execute_script("return [...S.models[0].layers.keys()]") == [0]
        select(driver, "layer", 2)
        assert all(blank(driver, c) for c in A_PANELS), [shown(driver, c) for c in A_PANELS]
        assert all("loading layer 2" in caption(driver, c) for c in A_PANELS)
        assert "loading layer 2" in driver.find_element("id", "heads").text
        assert driver.find_element("id", "layer-shown").text == "2"
        driver.execute_script("release(false)")
        WebDriverWait(driver, 30).until(lambda d: shown(d, "map") == [2, 0])
        assert [shown(driver, c) for c in A_PANELS] == [[2, 0]] * 4
        assert caption(driver, "map") == "A: weights"
        api = post(url, {"text": PROMPT})[1]["attention"]
        assert f"{weight_in(hover(driver, 'map', 9, 4)):.6f}" == f"{api[2][0][9][4]:.6f}"
        assert len(driver.find_elements("css selector", "#heads canvas")) == 2

        # a request that fails: blank, and the error line says why
        select(driver, "layer", 1)
        driver.execute_script("release(true)")
        WebDriverWait(driver, 30).until(lambda d: "could not be loaded" in caption(d, "map"))
        assert all(blank(driver, c) for c in A_PANELS)
        assert "the server went away" in driver.find_element("id", "error").text
        select(driver, "layer", 2)
        assert [shown(driver, c) for c in A_PANELS] == [[2, 0]] * 4
        # saved with layers 0 and 2 loaded, not 1
        html = saved_html(driver)
    saved = tmp_path / "view.html"
    saved.write_text(html, encoding="utf-8")
    driver.get(saved.as_uri())
    wait_for_map(driver)
    select(driver, "layer", 1)
    assert all(blank(driver, c) for c in A_PANELS)
    assert all("not loaded when the page was saved" in caption(driver, c) for c in A_PANELS)
    select(driver, "layer", 0)
    assert [shown(driver, c) for c in A_PANELS] == [[0, 0]] * 4
    assert console_errors(driver) == []


def test_the_timeline_shows_its_step_layer_and_head_or_is_blank(tmp_path, char_tok, driver):
    """Snapshots of 2 layers beside a model of 3 (a layer they lack), and a step whose file went
    away after the page listed it (a step it cannot load): the step's map and heads are blank and
    say why, never an earlier step's or layer's; the lens goes with the step; a step and layer it
    has are drawn."""
    from selenium.webdriver.support.ui import WebDriverWait
    from viz import probes
    run = probed_run(tmp_path / "run", char_tok, n_layer=2)
    views = load_views([("run", str(run))], torch.device("cpu"))
    with serve(views) as url:
        first_load(driver, url, PROMPT)
        assert caption(driver, "tl-map") == "step 90: layer 0, head 0"
        select(driver, "layer", 2)
        # the model has layer 2, its snapshots do not; the step's lens stays
        assert shown(driver, "map") == [2, 0]
        assert blank(driver, "tl-map") and "no layer 2" in caption(driver, "tl-map")
        assert driver.find_elements("css selector", "#tl-heads canvas") == []
        assert len(driver.find_elements("css selector", "#tl-lens td")) == 3 * 10
        select(driver, "layer", 1)
        select(driver, "head", 1)
        assert driver.execute_script("const d = $('tl-map').dataset;"
                                     "return [d.step, d.layer, d.head]") == ["90", "1", "1"]
        assert caption(driver, "tl-map") == "step 90: layer 1, head 1"
        assert len(driver.find_elements("css selector", "#tl-heads canvas")) == 2

        # listed, then gone: the step cannot be loaded
        probes._path(run, 30).unlink()
        slide_to(driver, 0)
        WebDriverWait(driver, 30).until(lambda d: "could not be loaded" in caption(d, "tl-map"))
        assert blank(driver, "tl-map") and "step 30" in caption(driver, "tl-map")
        assert "step 30" in driver.find_element("id", "tl-lens").text
        assert driver.find_elements("css selector", "#tl-heads canvas, #tl-lens td") == []
        assert "step 30 · train loss 3.5000" in driver.find_element("id", "tl-status").text
        assert driver.find_element("id", "tl-curve").get_attribute("data-x0") == "30"
        slide_to(driver, 1)
        wait_for_step(driver, 60)
        assert caption(driver, "tl-map") == "step 60: layer 1, head 1"
        # the last layer's top ids at step 60
        first = probes.read_snapshot(run, 60)["lens_ids"][2].tolist()
        cells = [c.text for c in driver.find_elements("css selector", "#tl-lens td")]
        assert cells[-10:] == [cell_text(char_tok.decode([ids[0]])) for ids in first]
        html = saved_html(driver)
        # the step gone (a 404, and again as the page is saved), nothing else
        assert all("status of 404" in e for e in console_errors(driver))
    # a saved page holds the steps it could load, and says which it could not
    saved = tmp_path / "view.html"
    saved.write_text(html, encoding="utf-8")
    driver.get(saved.as_uri())
    wait_for_step(driver, 60)
    slide_to(driver, 0)
    assert blank(driver, "tl-map") and "step 30 was not saved" in caption(driver, "tl-map")
    slide_to(driver, 2)
    assert driver.find_element("id", "tl-map").get_attribute("data-step") == "90"
    assert console_errors(driver) == []


# the boxes' texts, each sent to the API as the JSON field's value ("": the field left out)
SETTINGS = [("topk", "top_k", t) for t in ("0", "3", "", "-1", "2.5", "2.0", "1e2")] + \
    [("topp", "top_p", t) for t in ("1", "0.5", "", "0", "1.5", "-0.1")] + \
    [("minp", "min_p", t) for t in ("0", "0.3", "1", "", "1.5", "-0.1")] + \
    [("temperature", "temperature", "0.7")]
DEFAULTS = {"topk": "0", "topp": "1", "minp": "0", "temperature": "1"}
BOX_NAMES = {"topk": "top-k", "topp": "top-p", "minp": "min-p"}


def set_boxes(driver, values: dict) -> None:
    driver.execute_script("for (const [id, v] of Object.entries(arguments[0])) $(id).value = v;"
                          "$('topk').dispatchEvent(new Event('input'));", values)


def bars(driver) -> list:
    return driver.execute_script("return NEXT.map(n => [n.id, n.prob])")


def same_bars(shown: list, api: list) -> bool:
    return [i for i, _ in shown] == [n["id"] for n in api] and \
        all(abs(p - n["prob"]) < 1e-6 for (_, p), n in zip(shown, api))


def test_next_token_settings_are_the_apis_and_a_refused_one_blanks_the_bars(
        tmp_path, char_tok, driver):
    """The top-k, top-p and min-p boxes take exactly the values the API takes (0 turns top-k and
    min-p off, as sample.py's flags, Hugging Face and llama.cpp; 1 top-p) and show the API's bars;
    a value the API refuses (a 400 line) leaves the bars blank, the caption naming the box, nothing
    to append or sample."""
    views = load_views([("run", str(tiny_run(tmp_path / "run", char_tok)))], torch.device("cpu"))
    state = ("return [$('bars-caption').textContent, $('append').disabled, $('sample').disabled,"
             "$(arguments[0]).classList.contains('invalid')]")
    with serve(views) as url:
        driver.get(url + "/")
        show(driver, PROMPT)
        wait_for_map(driver)
        for box, field, text in SETTINGS:
            set_boxes(driver, {**DEFAULTS, box: text})
            # the box's text as the field's JSON value, as it stands
            body = '{"text": %s, "layers": [0]%s}' % (json.dumps(PROMPT),
                                                       f', "{field}": {text}' if text else "")
            status, out = post(url, body.encode())
            words, append_off, sample_off, marked = driver.execute_script(state, box)
            if status == 200:
                assert same_bars(bars(driver), out["next"]), (box, text)
                assert not (append_off or sample_off or marked) and "likeliest" in words
            else:
                assert status == 400 and "\n" not in out["error"] and field in out["error"]
                assert blank(driver, "bars") and bars(driver) == [], (box, text)
                assert append_off and sample_off and marked
                assert words.startswith(f"{BOX_NAMES[box]} "), words
        # all at once
        set_boxes(driver, {"topk": "5", "topp": "0.9", "minp": "0.05", "temperature": "0.7"})
        out = post(url, {"text": PROMPT, "layers": [0], "top_k": 5, "top_p": 0.9, "min_p": 0.05,
                         "temperature": 0.7})[1]["next"]
        assert same_bars(bars(driver), out) and len(out) <= 5
        # greedy: the argmax alone
        set_boxes(driver, {**DEFAULTS, "temperature": "0"})
        greedy = post(url, {"text": PROMPT, "temperature": 0})[1]["next"]
        assert bars(driver) == [[greedy[0]["id"], 1]]
        assert console_errors(driver) == []


def test_the_saved_html_keeps_the_timeline_and_the_settings(tmp_path, char_tok, driver):
    """docs/explore.md: the saved file is the whole view, opens offline, still hovers, switches
    heads and moves the sliders: the training timeline's among them (every step, the one shown
    first), and the settings' boxes."""
    from selenium.webdriver.support.ui import WebDriverWait
    from viz import probes
    run = probed_run(tmp_path / "run", char_tok)
    views = load_views([("run", str(run))], torch.device("cpu"))
    with serve(views) as url:
        first_load(driver, url, PROMPT)
        slide_to(driver, 1)
        wait_for_step(driver, 60)
        select(driver, "head", 1)
        set_boxes(driver, {"topk": "4"})
        api = post(url, {"text": PROMPT})[1]
        # step 30 was never shown: loaded for the file
        html = saved_html(driver)
    saved = tmp_path / "view.html"
    saved.write_text(html, encoding="utf-8")
    assert "http://" not in html and "https://" not in html
    # the server is gone
    driver.get(saved.as_uri())
    wait_for_map(driver)
    timeline = driver.find_element("id", "timeline")
    assert timeline.is_displayed()
    assert driver.find_element("id", "tl-slider").get_attribute("value") == "1"
    assert driver.execute_script("const d = $('tl-map').dataset; return [d.step, d.head]") == \
        ["60", "1"]
    assert "step 60 · train loss 2.7500 (the step's batch) · head 1" in timeline.text
    slide_to(driver, 0)
    wait_for_step(driver, 30)
    first = probes.read_snapshot(run, 30)["lens_ids"][3].tolist()
    cells = [c.text for c in driver.find_elements("css selector", "#tl-lens td")]
    assert cells[-10:] == [cell_text(char_tok.decode([ids[0]])) for ids in first]
    driver.execute_script("window.seen = []; const draw = renderTimeline; renderTimeline = () => {"
                          "  draw(); seen.push(+$('tl-map').dataset.step); }; $('play').click();")
    WebDriverWait(driver, 30).until(
        lambda d: d.execute_script("return !TL.playing && seen.length > 2"))
    assert driver.execute_script("return seen") == [30, 60, 90]
    # switches heads: the map and the timeline's
    select(driver, "head", 0)
    assert shown(driver, "map") == [0, 0]
    assert driver.find_element("id", "tl-map").get_attribute("data-head") == "0"
    assert f"{weight_in(hover(driver, 'map', 6, 2)):.6f}" == f"{api['attention'][0][0][6][2]:.6f}"
    # the boxes as saved, and they still act (a saved page appends nothing)
    assert driver.execute_script("return [$('topk').value, NEXT.length]") == ["4", 4]
    assert driver.execute_script("return ['append', 'sample', 'step'].map(id => $(id).disabled)") \
        == [True] * 3
    set_boxes(driver, DEFAULTS)
    assert [n["id"] for n in api["next"]] == [i for i, _ in bars(driver)]
    assert console_errors(driver) == []
