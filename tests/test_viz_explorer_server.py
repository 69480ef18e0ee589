"""The explorer as a local web server, defended as Jupyter and TensorBoard are (viz/explorer/guard.py): only the
hosts it listens as (DNS rebinding), only its own page (cross-site requests), only JSON bodies; and its hygiene
(viz/explorer/server.py): strict JSON in every reply, the standard library's refusals as JSON lines, errors that
say `Connection: close`, idle connections closed, and a terminal that stays clean when clients go away; the logit
lens and probe snapshot API (POST /api/lens, GET /api/probes[/STEP])."""
from __future__ import annotations

import http.client
import json
import socket
import struct
import threading
import time
import urllib.error
import urllib.request

import pytest
import torch

import explore
from tests.test_explore import PROMPT, char_tok, one, post, serving, tiny_run  # noqa: F401 (fixtures)
from viz.explorer import guard, server
from viz.explorer.model_view import load_views


def strict(raw: bytes):
    """JSON as strict parsers read it: NaN and Infinity are errors."""
    def refuse(name):
        raise ValueError(f"{name} in a reply")
    return json.loads(raw, parse_constant=refuse)


def exchange(url: str, request: bytes) -> tuple[int, http.client.HTTPMessage, bytes]:
    """(status, headers, body) of one raw request (PORT in it is replaced by the server's port)."""
    host, port = url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=10) as s:
        s.sendall(request.replace(b"PORT", port.encode()))
        r = http.client.HTTPResponse(s)
        r.begin()
        return r.status, r.headers, r.read()


def refused(url: str, request: bytes) -> tuple[int, str]:
    """(status, error line) of a request the server refuses with a JSON line, saying it closes the connection."""
    status, headers, body = exchange(url, request)
    assert status >= 400 and headers["Content-Type"] == "application/json", (status, body)
    assert headers["Connection"] == "close"
    out = strict(body)
    assert set(out) == {"error"} and "\n" not in out["error"]
    return status, out["error"]


def api_request(host: str = "127.0.0.1:PORT", headers: str = "Content-Type: application/json\r\n",
                body: bytes = b'{"text": "ROMEO"}') -> bytes:
    return (f"POST /api/attention HTTP/1.1\r\nHost: {host}\r\n{headers}Content-Length: {len(body)}\r\n\r\n"
            .encode() + body)


@pytest.mark.parametrize("host", ["evil.example.com:PORT", "evil.example.com", "127.0.0.1.nip.io:PORT",
                                  "localhost.evil.example:PORT", "127.0.0.2:PORT", "localhost:PORT@evil.example"])
def test_a_host_it_does_not_listen_as_is_refused(one, host):
    """DNS rebinding: the attacker's page sends its own name as Host; pages, /api/info (the checkpoint's absolute
    path) and the model are all refused."""
    url, views = one
    for request in (f"GET /api/info HTTP/1.1\r\nHost: {host}\r\n\r\n".encode(),
                    f"GET / HTTP/1.1\r\nHost: {host}\r\n\r\n".encode(), api_request(host)):
        status, error = refused(url, request)
        assert status == 403 and "not an address this explorer listens as (127.0.0.1, ::1, localhost)" in error
    assert views[0].runs == 0


def test_the_hosts_it_listens_as_are_answered(one, monkeypatch):
    url, _ = one
    for host in ("127.0.0.1:PORT", "localhost:PORT", "LOCALHOST:PORT", "[::1]:PORT", "localhost"):
        assert exchange(url, f"GET /api/info HTTP/1.1\r\nHost: {host}\r\n\r\n".encode())[0] == 200
    assert refused(url, b"GET /api/info HTTP/1.1\r\n\r\n") == (400, "the request has no Host header: send one, "
                                                                    "Host: 127.0.0.1:PORT (as every HTTP/1.1 client "
                                                                    "does)")
    assert refused(url, b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\nHost: evil.example\r\n\r\n")[1].startswith(
        "the request has 2 Host headers")
    monkeypatch.setattr(guard.socket, "gethostname", lambda: "Box")
    named = guard.Hosts("my.box.lan", "192.168.1.5")  # --host NAME: the name, and the address explore.py prints
    assert named.allows("my.box.lan") and named.allows("192.168.1.5") and not named.allows("box")
    every = guard.Hosts("0.0.0.0")  # every interface: its IP addresses and its name, never another site's name
    assert all(every.allows(n) for n in ("192.168.1.5", "::1", "127.0.0.1", "box", "localhost"))
    assert not every.allows("evil.example.com") and not every.allows("box.evil.example")


CROSS_SITE = [("Origin: http://evil.example.com\r\n", 403, "comes from the page at 'http://evil.example.com'"),
              ("Origin: null\r\n", 403, "comes from the page at 'null'"),
              ("Origin: http://127.0.0.1:1\r\n", 403, "another site"),
              ("Origin: https://127.0.0.1:PORT\r\n", 403, "another site"),
              ("Sec-Fetch-Site: cross-site\r\n", 403, "Sec-Fetch-Site: cross-site"),
              ("Sec-Fetch-Site: same-site\r\n", 403, "Sec-Fetch-Site: same-site")]


@pytest.mark.parametrize("headers,status,words", CROSS_SITE, ids=[w[:30] for _, _, w in CROSS_SITE])
def test_a_request_from_another_sites_page_is_refused(one, headers, status, words):
    url, views = one
    got, error = refused(url, api_request(headers="Content-Type: application/json\r\n" + headers))
    assert got == status and words in error, error
    assert views[0].runs == 0


def test_the_api_takes_only_json_bodies(one):
    """text/plain and forms are what a page on another site may post without a preflight."""
    url, views = one
    for kind in ("text/plain", "application/x-www-form-urlencoded", "multipart/form-data; boundary=x", None):
        headers = f"Origin: http://127.0.0.1:PORT\r\nContent-Type: {kind}\r\n" if kind else ""
        status, error = refused(url, api_request(headers=headers))
        assert status == 415 and "send JSON with Content-Type: application/json" in error
    assert views[0].runs == 0
    own = ("Origin: http://127.0.0.1:PORT\r\nSec-Fetch-Site: same-origin\r\n"
           "Content-Type: application/json; charset=utf-8\r\n")
    assert exchange(url, api_request(headers=own))[0] == 200  # the page's own request


def test_no_reply_holds_nan_or_infinity(one):
    """A temperature too small to divide by, and a model that computes NaN: strict JSON, the binary header too."""
    url, views = one
    for temperature in (1e-45, 5e-324, 1e-300):
        for body in ({"text": PROMPT, "temperature": temperature}, {"text": PROMPT, "temperature": temperature,
                                                                     "top_k": 3}):
            status, _, raw = exchange(url, api_request(body=json.dumps(body).encode()))
            out = strict(raw)
            assert status == 200 and all(0 < n["prob"] <= 1 for n in out["next"]), out["next"]
    views[0].model.transformer.h[1].attn.c_attn.weight.data[0, 0] = float("nan")  # broken weights
    for path in (b"/api/attention", b"/api/attention.bin"):
        status, _, raw = exchange(url, api_request(body=b'{"text": "ROMEO!"}').replace(b"/api/attention", path))
        assert status == 500 and strict(raw)["error"].startswith(
            "the model failed on this request (NonFiniteError: the model computed NaN or infinity in layer 1's scores")


def test_a_client_gone_before_its_reply_leaves_the_terminal_clean(tmp_path, char_tok, capsys):
    """Clients that close (a tab closed, a script stopped) while the model runs: no BrokenPipeError traceback."""
    views = load_views([("run", str(tiny_run(tmp_path / "run", char_tok)))], torch.device("cpu"))
    with serving(views) as srv:
        url = f"http://127.0.0.1:{srv.server_address[1]}"
        clients_go_away(srv)
        assert post(url, {"text": "ROMEO"})[0] == 200
    err = capsys.readouterr().err
    assert "Traceback" not in err and "Error" not in err, err


def clients_go_away(srv, n: int = 3) -> None:
    """n clients send a request and reset their connection while the model is busy; back when the server is done."""
    done = threading.Semaphore(0)
    original = srv.shutdown_request
    srv.shutdown_request = lambda request: (original(request), done.release())
    with srv.lock:  # the model is busy: each client goes away before its reply is written
        for _ in range(n):
            s = socket.create_connection(srv.server_address[:2])
            s.sendall(api_request().replace(b"PORT", str(srv.server_address[1]).encode()))
            s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))  # reset, not a polite close
            time.sleep(0.05)  # the request is read and waits for the lock
            s.close()
    for _ in range(n):
        assert done.acquire(timeout=10)


def test_idle_and_stalled_connections_are_closed_quietly(one, monkeypatch, capsys):
    url, _ = one
    assert server.Handler.timeout <= 30
    monkeypatch.setattr(server.Handler, "timeout", 0.3)
    host, port = url.removeprefix("http://").split(":")
    for sent in (b"", b"GET / HTTP/1.1\r\nHost: 127", api_request()[:-5]):  # idle, a header or a body not ended
        with socket.create_connection((host, int(port)), timeout=10) as s:
            s.sendall(sent)
            t0 = time.perf_counter()
            assert s.recv(1000) == b"" and time.perf_counter() - t0 < 5  # closed by the server, nothing said
    assert post(url, {"text": "ROMEO"})[0] == 200
    assert capsys.readouterr().err == ""


def test_an_error_reply_says_connection_close_and_the_next_request_works(one):
    url, _ = one
    conn = http.client.HTTPConnection(*url.removeprefix("http://").split(":"), timeout=10)
    for body, status in ((b'{"text": ""}', 400), (b"x" * (server.MAX_BODY + 1), 413), (b'{"text": "ROMEO"}', 200)):
        conn.request("POST", "/api/attention", body, {"Content-Type": "application/json"})
        r = conn.getresponse()
        assert r.status == status and strict(r.read())
        assert (r.getheader("Connection") == "close") == (status >= 400)
    conn.request("GET", "/api/info")  # keep-alive after a success
    r = conn.getresponse()
    assert r.status == 200 and r.getheader("Connection") is None and strict(r.read())
    conn.request("GET", "/api/info", b'{"text": "x"}')  # a body the explorer does not read: the connection closes
    r = conn.getresponse()
    assert r.status == 200 and r.getheader("Connection") == "close" and strict(r.read())
    conn.request("GET", "/api/info")
    assert conn.getresponse().status == 200
    conn.close()


MALFORMED = [(b"OPTIONS /api/attention HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n", 405, "OPTIONS is not supported"),
             (b"GARBAGE\r\n\r\n", 400, "Bad request syntax ('GARBAGE')"),
             (b"GET / HTTP/1.1 extra\r\n\r\n", 400, "Bad request version ('extra')"),
             (b"GET / HTTP/9.9\r\n\r\n", 505, "Invalid HTTP version"),
             (b"BREW /pot HTTP/1.1\r\n\r\n", 501, "Unsupported method ('BREW')"),
             (b"GET /" + b"x" * 70000 + b" HTTP/1.1\r\n\r\n", 414, "Request-URI Too Long"),
             (b"GET / HTTP/1.1\r\nX: " + b"x" * 70000 + b"\r\n\r\n", 431, "Line too long"),
             (b"GET /api/attention HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n", 405, "takes a POST with a JSON body"),
             (api_request(headers="Content-Type: application/json\r\nContent-Length: -5\r\n")
              .replace(b"Content-Length: 17\r\n", b""), 400, "Content-Length '-5' is not a number of bytes"),
             (api_request(headers="Content-Type: application/json\r\nContent-Length: 16\r\n"), 400,
              "Content-Length '16, 17' is not a number of bytes"),
             (api_request().replace(b"Content-Length: 17", b"Content-Length: \xc2\xb2"), 400,
              "is not a number of bytes"),
             (api_request().replace(b"Content-Length: 17", b"X: y"), 411, "the request has no Content-Length"),
             (api_request().replace(b"Content-Length: 17", b"Transfer-Encoding: chunked"), 411, "chunked")]


@pytest.mark.parametrize("request_bytes,status,words", MALFORMED, ids=[w[:24] for _, _, w in MALFORMED])
def test_every_refusal_is_a_json_line(one, request_bytes, status, words):
    """The standard library's own refusals too (OPTIONS, a malformed request line): no HTML page."""
    url, _ = one
    got, error = refused(url, request_bytes)
    assert got == status and words in error, error


def get(url: str, path: str):
    """(status, decoded strict JSON answer) of a GET."""
    try:
        with urllib.request.urlopen(url + path, timeout=30) as r:
            return r.status, strict(r.read())
    except urllib.error.HTTPError as e:
        return e.code, strict(e.read())


def test_the_lens_ends_in_the_models_own_next_token_distribution(one):
    """POST /api/lens: n_layer + 1 rows of T cells, each the top tokens, most likely first (never a padded id); the
    last row's last cell is /api/attention's next-token list at temperature 1."""
    url, views = one
    status, out = post(url, {"text": PROMPT}, "/api/lens")
    assert status == 200 and set(out) == {"tokens", "ids", "lens"}
    T, V = len(PROMPT), views[0].tokenizer.vocab_size
    assert out["tokens"] == list(PROMPT) and len(out["lens"]) == views[0].n_layer + 1
    assert all(len(row) == T and all(len(cell) == 5 for cell in row) for row in out["lens"])
    cells = [cell for row in out["lens"] for cell in row]
    assert all(set(c) == {"token", "id", "prob"} and 0 <= c["id"] < V for cell in cells for c in cell)
    assert all([c["prob"] for c in cell] == sorted((c["prob"] for c in cell), reverse=True) for cell in cells)
    nxt = post(url, {"text": PROMPT})[1]["next"][:3]
    last = post(url, {"ids": out["ids"], "top": 3}, "/api/lens")[1]["lens"][-1][-1]
    assert [c["id"] for c in last] == [n["id"] for n in nxt]
    assert all(abs(c["prob"] - n["prob"]) <= 1e-5 and c["token"] == n["token"] for c, n in zip(last, nxt))
    assert post(url, {"text": PROMPT, "top": 0}, "/api/lens") == (400, {"error": "top 0 is invalid: use a whole "
                                                                                 "number from 1 to 20 (tokens per "
                                                                                 "position)"})
    assert get(url, "/api/lens")[0] == 405


def test_probes_of_a_run_without_snapshots_are_an_empty_list(one):
    url, _ = one
    assert get(url, "/api/probes") == (200, {"text": "", "tokens": [], "steps": [], "val_loss": [], "train_loss": []})
    assert get(url, "/api/probes/0") == (404, {"error": "no probe snapshot at step 0: GET /api/probes lists the "
                                                        "steps recorded"})


def test_probes_list_the_steps_and_answer_each_recorded_one(one):
    """GET /api/probes: the probe, its steps and the loss at each (val at an evaluation, else the step's train loss,
    null where none); GET /api/probes/STEP: the snapshot's weights and lens; any other step or path is a 404 line."""
    from tests.test_viz_probes import snapshot
    from viz import probes
    url, views = one
    run, V = views[0].run_dir, views[0].tokenizer.vocab_size
    for step, losses in ((0, {"val_loss": None}), (20, {"val_loss": None, "train_loss": 3.75}), (50, {})):
        probes.write_snapshot(run, step, **{**snapshot(step, L=3, H=2, T=5, V=V), "ids": views[0].encode("ROMEO"),
                                            **losses})
    assert get(url, "/api/probes") == (200, {"text": "ROMEO", "tokens": list("ROMEO"), "steps": [0, 20, 50],
                                             "val_loss": [None, None, 3.5], "train_loss": [None, 3.75, None]})
    status, out = get(url, "/api/probes/50")
    want = snapshot(50, L=3, H=2, T=5, V=V)
    assert status == 200 and out["step"] == 50
    assert torch.equal(torch.tensor(out["attention"]), want["attention"].half().double())  # the stored values
    cell = out["lens"][3][4]  # the last layer, the last position
    assert [c["id"] for c in cell] == want["lens_ids"][3, 4].tolist()
    assert all(c["token"] == views[0].tokenizer.decode([c["id"]]) for c in cell)
    assert [c["prob"] for c in cell] == pytest.approx(want["lens_probs"][3, 4].half().tolist(), abs=1e-9)
    for path in ("/api/probes/49", "/api/probes/-1", "/api/probes/x", "/api/probes/", "/api/probess"):
        status, out = get(url, path)
        assert status == 404 and set(out) == {"error"}, path
    assert post(url, {}, "/api/probes")[0] == 404


def test_the_page_starts_with_the_runs_probe_text_else_a_line_every_model_takes(tmp_path, char_tok, tiny_corpus):
    """So that the first load shows every panel: the probe text of model A's run (the text its timeline shows),
    else a stock line every model can take (the tiny runs' context of 32 takes only its "ROMEO:"), else none; a
    prompt given (--prompt) wins."""
    from data.tokenizer import CharTokenizer
    from tests.test_viz_probes import snapshot
    from viz import probes
    from viz.explorer.model_view import STOCK_PROMPTS, first_prompt
    cpu = torch.device("cpu")
    run = tiny_run(tmp_path / "run", char_tok)
    views = load_views([("run", str(run))], cpu)
    assert first_prompt(views) == "ROMEO:"
    with serving(views) as srv:
        assert srv.prompt == "ROMEO:"
    full = CharTokenizer(tiny_corpus.read_text() + STOCK_PROMPTS[0])
    assert first_prompt(load_views([("run", str(tiny_run(tmp_path / "wide", full, block_size=64)))], cpu)) == \
        STOCK_PROMPTS[0]
    lower = load_views([("run", str(tiny_run(tmp_path / "lower", CharTokenizer("the king is good\n"))))], cpu)
    assert first_prompt(lower) == "" and first_prompt([*views, *lower]) == ""  # (B cannot take it)
    probes.write_snapshot(run, 3, **{**snapshot(3, L=3, H=2, T=8), "text": "The king", "ids": char_tok.encode("The king")})
    assert first_prompt(views) == "The king"
    with serving(views) as srv, serving(views, "KING:") as given:
        assert (srv.prompt, given.prompt) == ("The king", "KING:")
