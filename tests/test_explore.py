"""explore.py and viz/explorer: the /api/attention contract against transformers' output_attentions, the compact
binary form, the kept results, two-model compare, every bad input as one 4xx JSON line, and the CLI's own lines.

`serve`/`serving` (an in-process server on a free port) and `tiny_run` (a tiny random checkpoint) are shared with
test_explore_browser and test_viz_explorer_*.
"""
from __future__ import annotations

import contextlib
import http.client
import json
import signal
import socket
import struct
import threading
import urllib.error
import urllib.request

import numpy as np
import pytest
import torch

from model.gpt import GPT

import explore
from viz.explorer.model_view import load_views
from tests.helpers import run_cli
from tests.helpers import model_variants
from tests.helpers import save_run, tiny_model
from viz.explorer.server import MAX_BODY, make_server

PROMPT = "ROMEO:\nThe king is good"


@pytest.fixture
def char_tok(tiny_corpus):
    from data.tokenizer import CharTokenizer
    return CharTokenizer(tiny_corpus.read_text() + "RMEO")


def tiny_run(path, tokenizer, seed: int = 0, **kw):
    """A run directory with a random tiny model's best.pt (3 layers, 2 heads, context 32, padded vocabulary)."""
    model = tiny_model(tokenizer.vocab_size + 3, seed, **{"n_layer": 3, "block_size": 32, **kw})
    save_run(path, model, tokenizer)
    return path


@contextlib.contextmanager
def serving(views, prompt: str = ""):
    """An in-process explorer on a free port: the server."""
    server = make_server(views, "127.0.0.1", 0, prompt)
    thread = threading.Thread(target=server.serve_forever, args=(0.02,), daemon=True)  # quick shutdown
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


@contextlib.contextmanager
def serve(views, prompt: str = ""):
    """An in-process explorer on a free port; its base URL."""
    with serving(views, prompt) as server:
        yield f"http://127.0.0.1:{server.server_address[1]}"


def post(url: str, body, path: str = "/api/attention"):
    """(status, decoded answer) of a POST; a dict body is sent as JSON, bytes as they are."""
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    req = urllib.request.Request(url + path, data=data, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            raw = r.read()
            return r.status, (raw if path.endswith(".bin") else json.loads(raw))
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


@pytest.fixture
def one(tmp_path, char_tok):
    views = load_views([("run", str(tiny_run(tmp_path / "run", char_tok)))], torch.device("cpu"))
    with serve(views) as url:
        yield url, views


def test_contract(one):
    url, views = one
    status, out = post(url, {"text": PROMPT, "layers": [2, 0], "temperature": 0.7, "top_k": 5})
    assert status == 200, out
    T = len(PROMPT)
    assert out["tokens"] == list(PROMPT) and len(out["ids"]) == T
    att = np.array(out["attention"])
    assert att.shape == (2, 2, T, T)
    above, below = np.triu_indices(T, 1), np.tril_indices(T)
    assert (att[:, :, above[0], above[1]] == 0).all() and (att[:, :, below[0], below[1]] > 0).all()
    assert np.allclose(att.sum(-1), 1, atol=1e-5)
    full = np.array(post(url, {"text": PROMPT})[1]["attention"])  # all layers by default, in order
    assert full.shape == (3, 2, T, T) and np.array_equal(full[[2, 0]], att)
    nxt = out["next"]
    assert len(nxt) == 5 and set(nxt[0]) == {"token", "id", "prob"}  # top_k 5: only the tokens that can be drawn
    probs = [n["prob"] for n in nxt]
    assert probs == sorted(probs, reverse=True) and abs(sum(probs) - 1) < 1e-6 and min(probs) > 0
    assert len(post(url, {"text": PROMPT})[1]["next"]) == 20
    from model.generate import Sampling, logits_to_probs
    logits = views[0].last.logits
    assert logits.numel() == views[0].tokenizer.vocab_size  # the padded rows are no tokens
    ids = views[0].last.ids  # the tokens so far, which a rule may read
    expect = logits_to_probs(logits, torch.tensor(ids), Sampling(0.7, 5))
    assert all(abs(expect[n["id"]] - n["prob"]) < 1e-6 and n["token"] == views[0].tokenizer.decode([n["id"]])
               for n in nxt)
    near_top = post(url, {"text": PROMPT, "min_p": 0.5})[1]["next"]  # as sample.py --min-p 0.5
    expect = logits_to_probs(logits, torch.tensor(ids), Sampling(min_p=0.5))
    assert len(near_top) == min(20, int((expect > 0).sum())) < 20 and all(
        abs(expect[n["id"]] - n["prob"]) < 1e-6 and n["prob"] >= 0.5 * near_top[0]["prob"] for n in near_top)
    greedy = post(url, {"text": PROMPT, "temperature": 0})[1]["next"]
    assert greedy == [{"token": views[0].tokenizer.decode([int(logits.argmax())]), "id": int(logits.argmax()),
                       "prob": 1.0}]
    assert out["text"] == PROMPT


def test_scores_are_the_ones_softmaxed(one):
    url, views = one
    out = post(url, {"text": PROMPT, "layers": [1], "scores": True, "logits": True})[1]
    scores, att = torch.tensor(out["scores"][0]), torch.tensor(out["attention"][0])
    T = scores.size(-1)
    assert (scores.triu(1) != 0).any()  # raw: the future's scores too, before the mask
    masked = scores.masked_fill(torch.ones(T, T, dtype=torch.bool).triu(1), float("-inf"))
    assert torch.allclose(torch.softmax(masked, -1), att, atol=1e-6)
    assert len(out["logits"]) == views[0].tokenizer.vocab_size


@pytest.mark.parametrize("kw", [{}, {"bias": False}, {"tie_weights": False}, {"attention": "manual"},
                                {"n_head": 4}], ids=["default", "bias_free", "untied", "manual", "4_heads"])
@pytest.mark.slow  # over ~1 s
def test_weights_equal_transformers_output_attentions(tmp_path, char_tok, kw):
    transformers = pytest.importorskip("transformers")
    import export
    run = tiny_run(tmp_path / "run", char_tok, seed=1, **kw)
    views = load_views([("run", str(run))], torch.device("cpu"))
    export.write_export(views[0].model, views[0].tokenizer, tmp_path / "hf")
    hf = transformers.GPT2LMHeadModel.from_pretrained(tmp_path / "hf", attn_implementation="eager").eval()
    assert_attention_is_transformers(views, hf)


def assert_attention_is_transformers(views, hf):
    """The explorer's weights for PROMPT are `hf`'s output_attentions (eager) within 1e-5; its top tokens too."""
    with serve(views) as url:
        out = post(url, {"text": PROMPT})[1]
    with torch.no_grad():
        hf_out = hf(torch.tensor([out["ids"]]), output_attentions=True)
    theirs = torch.stack(hf_out.attentions)[:, 0]  # (layers, heads, T, T)
    ours = torch.tensor(out["attention"])
    assert ours.shape == theirs.shape and (ours - theirs).abs().max() <= 1e-5
    top = [n["id"] for n in out["next"]]
    assert top[:3] == hf_out.logits[0, -1].topk(3).indices.tolist()


MODERN = dict(position="rope", norm="rmsnorm", mlp="swiglu", rope_theta=500.0, n_head=4, n_embd=32)


@pytest.mark.parametrize("cls,kw", [
    ("LlamaForCausalLM", dict(n_kv_head=2, tie_weights=False)),
    ("Qwen3ForCausalLM", dict(qk_norm=True, n_kv_head=1, head_dim=12, bias=False)),
], ids=["llama", "qwen3"])
def test_weights_equal_transformers_output_attentions_of_llama_and_qwen3(tmp_path, char_tok, capsys, cls, kw):
    """Rotary, GQA / multi-query, qk-norm, a head_dim of its own: `export.py --hf` writes a Llama / Qwen3 directory
    whose eager attention is what the explorer shows."""
    transformers = pytest.importorskip("transformers")
    import export
    run = tiny_run(tmp_path / "run", char_tok, seed=1, **MODERN, **kw)
    assert export.main(["--hf", str(tmp_path / "hf"), "--run", str(run)]) == 0
    assert f"(a {cls})" in capsys.readouterr().out
    hf = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "hf", attn_implementation="eager").eval()
    assert type(hf).__name__ == cls
    assert_attention_is_transformers(load_views([("run", str(run))], torch.device("cpu")), hf)


def test_binary_form_is_the_json_data(one):
    url, _ = one
    body = {"text": PROMPT, "layers": [1, 2], "scores": True, "logits": True}
    js = post(url, body)[1]
    status, raw = post(url, body, "/api/attention.bin")
    assert status == 200
    n = struct.unpack("<I", raw[:4])[0]
    header = json.loads(raw[4:4 + n])
    data = raw[4 + n:]
    assert (4 + n) % 4 == 0 and header["tokens"] == js["tokens"] and header["next"] == js["next"]
    arrays = {(a["name"], a["layer"]): np.frombuffer(data, "<f4", int(np.prod(a["shape"])), a["offset"])
              .reshape(a["shape"]) for a in header["arrays"]}
    assert np.abs(arrays["attention", 2] - np.array(js["attention"][1])).max() <= 1e-10  # JSON: 10 decimals
    assert np.abs(arrays["scores", 1] - np.array(js["scores"][0])).max() <= 1e-10
    assert np.abs(arrays["logits", None] - np.array(js["logits"])).max() <= 1e-10
    above = np.triu_indices(len(PROMPT), 1)
    assert (arrays["attention", 2][:, above[0], above[1]] == 0).all()


def test_the_model_runs_only_for_new_tokens_or_layers(one):
    url, views = one
    view = views[0]
    post(url, {"text": PROMPT, "layers": [0]})
    post(url, {"text": PROMPT, "layers": [0], "temperature": 0.5, "top_k": 3})  # sliders: no run
    assert view.runs == 1
    post(url, {"text": PROMPT, "layers": [0, 1]})  # a new layer of the same tokens: one run, layer 0 kept
    assert view.runs == 2 and sorted(view.last.weights) == [0, 1]
    ids = post(url, {"text": PROMPT + "!", "layers": [0]})[1]["ids"]
    assert view.runs == 3 and sorted(view.last.weights) == [0]
    assert post(url, {"ids": ids, "layers": [0]})[1]["tokens"][-1] == "!" and view.runs == 3  # ids: the same


def test_zero_turns_top_k_and_min_p_off(one):
    """As sample.py's --top-k 0 and --min-p 0 (Hugging Face's and llama.cpp's meaning) and the
    page's boxes: 0 is no filter, the same answer as leaving the field out; top_p 1 keeps every
    token too."""
    url, _ = one
    everything = post(url, {"text": PROMPT, "layers": [0]})[1]["next"]
    assert len(everything) == 20
    offs = ({"top_k": 0}, {"min_p": 0}, {"min_p": 0.0}, {"top_p": 1},
            {"top_k": 0, "min_p": 0, "top_p": 1.0})
    for off in offs:
        status, out = post(url, {"text": PROMPT, "layers": [0], **off})
        assert status == 200 and out["next"] == everything, (off, out)


def test_two_models_and_their_tokenizers(tmp_path, char_tok, tiny_corpus):
    a, b = tiny_run(tmp_path / "a", char_tok, seed=1), tiny_run(tmp_path / "b", char_tok, seed=2, n_layer=2)
    views = load_views([("run", str(a)), ("checkpoint", str(b / "best.pt"))], torch.device("cpu"))
    with serve(views) as url:
        info = json.loads(urllib.request.urlopen(url + "/api/info").read())
        assert [m["n_layer"] for m in info["models"]] == [3, 2]
        out0, out1 = (post(url, {"text": PROMPT, "layers": [0], "model": m})[1] for m in (0, 1))
        assert out0["ids"] == out1["ids"] and out0["attention"] != out1["attention"]
        assert post(url, {"text": PROMPT, "layers": [2], "model": 1})[0] == 400
    from data.tokenizer import CharTokenizer
    tiny_run(tmp_path / "c", CharTokenizer("abcdefgh"))
    with pytest.raises(ValueError, match=r"^the two models use different tokenizers \(char \(\d+ characters\) vs "
                                         r"char \(8 characters\)\).*same tokenizer$"):
        load_views([("run", str(a)), ("run", str(tmp_path / "c"))], torch.device("cpu"))


def test_init_reads_an_export_of_the_run(tmp_path, char_tok):
    import export
    run = str(tiny_run(tmp_path / "run", char_tok, seed=3))
    view = load_views([("run", run)], torch.device("cpu"))[0]
    export.write_export(view.model, view.tokenizer, tmp_path / "hf")
    views = load_views([("run", run), ("init", str(tmp_path / "hf"))], torch.device("cpu"))
    with serve(views) as url:
        a, b = (post(url, {"text": PROMPT, "model": m})[1] for m in (0, 1))
    assert a["ids"] == b["ids"] and np.abs(np.array(a["attention"]) - np.array(b["attention"])).max() <= 1e-6
    assert [n["id"] for n in a["next"][:3]] == [n["id"] for n in b["next"][:3]]


BAD = [({"text": ""}, 400, "the text is empty"),
       ({"text": "R" * 33}, 400, "longer than the model's context of 32"),
       ({"text": "ROMEO 世界"}, 400, "characters not in the vocabulary: '世', '界'"),
       (b'{"text": "ROM', 400, "not valid JSON"),
       (b"\xff\xfe", 400, "not valid JSON"),
       ([1, 2], 400, "must be a JSON object"),
       ({"text": "ROMEO", "colour": 1}, 400, "unknown field 'colour'"),
       ({"text": "ROMEO", "layers": [3]}, 400, "layer 3 does not exist: the model has layers 0..2"),
       ({"text": "ROMEO", "layers": "0"}, 400, "layers must be a list"),
       ({"text": "ROMEO", "temperature": -1}, 400, "temperature=-1 is invalid"),
       ({"text": "ROMEO", "temperature": "hot"}, 400, "temperature='hot' is invalid"),
       ({"text": "ROMEO", "top_k": -1}, 400, "top_k=-1"),
       ({"text": "ROMEO", "top_k": 2.0}, 400, "top_k=2.0"),
       ({"text": "ROMEO", "top_p": 0}, 400, "top_p=0"),
       ({"text": "ROMEO", "min_p": 1.5}, 400, "min_p=1.5"),
       ({"text": "ROMEO", "min_p": -0.1}, 400, "min_p=-0.1"),
       ({"text": "ROMEO", "model": 1}, 400, "model 1 does not exist: use 0 (start explore.py with two models"),
       ({"ids": [0, 99999]}, 400, "token id 99999 is outside the vocabulary"),
       ({"ids": []}, 400, "the text is empty"),
       ({"text": 5}, 400, "give the text to look at"),
       (b"x" * (MAX_BODY + 1), 413, "over the 64 KB limit")]


@pytest.mark.slow  # over ~1 s in all
@pytest.mark.parametrize("body,status,words", BAD, ids=[w.split(":")[0][:30] for _, _, w in BAD])
def test_bad_input_is_one_4xx_json_line_and_the_server_keeps_serving(one, body, status, words):
    url, _ = one
    got, out = post(url, body)
    assert got == status and set(out) == {"error"} and words in out["error"] and "\n" not in out["error"]
    assert post(url, {"text": "ROMEO"})[0] == 200


def test_a_model_failure_is_a_500_line_and_the_server_goes_on(one, monkeypatch, capsys):
    url, views = one
    def broken(*a, **k):
        raise RuntimeError("CPU out of memory\ntried to allocate 5 GB")
    with monkeypatch.context() as m:
        m.setattr("viz.explorer.model_view.forward_with_attention", broken)
        status, out = post(url, {"text": "ROMEO"})
    assert status == 500 and out == {"error": "the model failed on this request (RuntimeError: CPU out of memory)"}
    assert "failed: RuntimeError: CPU out of memory" in capsys.readouterr().err
    assert post(url, {"text": "ROMEO"})[0] == 200


@pytest.mark.parametrize("path", ["/../explore.py", "/%2e%2e/explore.py", "//etc/passwd", "/static/../../README.md",
                                  "/viz/explorer/server.py", "/explorer.js/..", "/api/nothing"])
@pytest.mark.slow  # over ~1 s in all
def test_no_request_reads_a_file(one, path):
    url, _ = one
    conn = http.client.HTTPConnection(*url.removeprefix("http://").split(":"))
    conn.request("GET", path)
    r = conn.getresponse()
    assert r.status == 404 and "error" in json.loads(r.read())
    conn.request("GET", "/explorer.js")
    r = conn.getresponse()
    assert r.status == 200 and b"function" in r.read()
    conn.close()
    assert post(url, {"text": "ROMEO"}, "/api/nothing")[0] == 404


def test_info_and_static_pages(one):
    url, _ = one
    info = json.loads(urllib.request.urlopen(url + "/api/info").read())
    assert info["models"][0]["n_layer"] == 3 and info["models"][0]["block_size"] == 32
    page = urllib.request.urlopen(url + "/").read().decode()
    assert "explorer.js" in page and "http" not in page.replace("http-equiv", "")  # nothing from the network


def test_cli_errors_are_one_line(tmp_path, char_tok, capsys):
    run = str(tiny_run(tmp_path / "run", char_tok))
    cases = [(["--run", run, "--run", run, "--checkpoint", "x.pt"], "3 models given"),
             (["--run", run, "--port", "70000"], "--port 70000 is outside 0..65535"),
             (["--checkpoint", "missing.pt"], "checkpoint missing.pt does not exist"),
             (["--init", run], "is a tinygpt training run"),
             (["--init", "gpt2"], "--init gpt2 is not a local directory, and tinygpt never downloads models: get it "
                                  "with `hf download openai-community/gpt2 config.json model.safetensors --local-dir "
                                  "gpt2`, then use --init gpt2"),  # issue 43: it said "check the path"
             (["--out_dir=out"], "explore.py takes --run out, not --out_dir=out")]  # nanoGPT's flag
    with socket.socket() as s:  # a port in use
        s.bind(("127.0.0.1", 0))
        s.listen()
        cases.append((["--run", run, "--port", str(s.getsockname()[1])], "is in use (another explorer?): pass "
                                                                         "another --port"))
        for argv, words in cases:
            assert explore.main(argv) == 2
            err = [l for l in capsys.readouterr().err.splitlines() if not l.startswith("using ")]
            assert len(err) == 1 and err[0].startswith("error: ") and words in err[0], err


def test_host_warns_and_the_url_is_one_line(tmp_path, char_tok, capsys, monkeypatch):
    from viz.explorer import server
    def interrupted(self, *a, **k):
        raise KeyboardInterrupt
    monkeypatch.setattr(server.ExplorerServer, "serve_forever", interrupted)
    run = str(tiny_run(tmp_path / "run", char_tok))
    assert explore.main(["--run", run, "--port", "0", "--host", "0.0.0.0"]) == 130
    out, err = capsys.readouterr()
    assert out.startswith("explorer: http://0.0.0.0:") and len(out.strip().splitlines()) == 1
    assert err.startswith("using ") and "warning: listening on 0.0.0.0" in err and "Traceback" not in err


def test_an_ipv6_host_listens_and_its_url_is_bracketed(tmp_path, char_tok, capsys, monkeypatch):
    """--host ::1 bound an IPv4 socket and failed ("Address family for hostname not supported")."""
    import urllib.request

    from viz.explorer import server
    served = []
    def one_request(self, *a, **k):
        host, port = self.server_address[:2]
        answer = threading.Thread(target=self.handle_request)
        answer.start()
        with urllib.request.urlopen(f"http://[{host}]:{port}/api/info", timeout=10) as r:
            served.append((host, r.status, json.loads(r.read())["models"][0]["n_layer"]))
        answer.join()
        raise KeyboardInterrupt
    monkeypatch.setattr(server.ExplorerServer, "serve_forever", one_request)
    run = str(tiny_run(tmp_path / "run", char_tok))
    assert explore.main(["--run", run, "--port", "0", "--host", "::1"]) == 130
    assert served == [("::1", 200, 3)]  # the tiny run's 3 layers
    out, err = capsys.readouterr()
    assert out.startswith("explorer: http://[::1]:") and "warning" not in err  # a loopback address: no warning


@pytest.mark.slow
def test_cli_serves_and_ctrl_c_ends_quietly(tmp_path, char_tok):
    import subprocess
    import sys

    from tests.helpers import REPO
    run = tiny_run(tmp_path / "run", char_tok)
    proc = subprocess.Popen([sys.executable, str(REPO / "explore.py"), "--run", str(run), "--port", "0"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line = proc.stdout.readline()
        assert line.startswith("explorer: http://127.0.0.1:"), proc.stderr.read()
        url = line.split()[1].rstrip("/")
        assert post(url, {"text": "ROMEO"})[0] == 200 and post(url, b"{")[0] == 400
        assert post(url, {"text": "ROMEO"})[0] == 200
    finally:
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=30)
    assert proc.returncode == 130 and "Traceback" not in err and out.strip() == "", (out, err)
    assert run_cli(["explore.py", "--port", "1"], cwd=tmp_path).stderr.startswith("error: no trained model found")


@pytest.mark.parametrize("name,config", model_variants(), ids=[n for n, _ in model_variants()])
def test_every_model_setting_is_shown_as_the_model_computes_it(name, config):
    """rope, GQA/MQA, qk-norm, head_dim, rmsnorm, swiglu/relu2, softcap, bias, tying: the explorer's weights are the
    model's own (attention_maps), causal, and the softmax of its masked raw scores; its logits are the forward's."""
    from viz.explorer.model_view import forward_with_attention
    torch.manual_seed(0)
    model = GPT(config).eval()
    ids = torch.randint(0, config.vocab_size, (config.block_size,)).tolist()
    res = forward_with_attention(model, ids, list(range(config.n_layer)))
    maps = model.attention_maps(torch.tensor([ids]))[:, 0]  # (L, nh, T, T)
    T, causal = len(ids), torch.ones(len(ids), len(ids), dtype=torch.bool).tril()
    for layer in range(config.n_layer):
        w, s = res.weights[layer], res.scores[layer]
        assert w.shape == (config.n_head, T, T) and torch.allclose(w, maps[layer], atol=1e-6)
        assert (w[:, ~causal] == 0).all()
        assert torch.allclose(torch.softmax(s.masked_fill(~causal, float("-inf")), -1), w, atol=1e-6)
    with torch.no_grad():
        assert torch.allclose(res.logits, model(torch.tensor([ids]))[0][0, -1].float(), atol=1e-5)
