"""serve.py's endpoint with the official `openai` client: a real client against a real server on
127.0.0.1 (in this process, on a thread), a tiny random model with tinygpt's chat template."""
from __future__ import annotations

import http.client
import json
import threading

import pytest
import torch

from chat.server import ChatServer, Endpoint
from data.chat_template import with_chat
from data.tokenizer import CharTokenizer, tokenizer_from_dict

openai = pytest.importorskip("openai")


@pytest.fixture(scope="module")
def server():
    from model.config import GPTConfig
    from model.gpt import GPT
    tok = tokenizer_from_dict(with_chat(CharTokenizer("abcdefghijklmnopqrstuvwxyz .?!-").to_dict()))
    torch.manual_seed(0)
    config = GPTConfig(vocab_size=tok.vocab_size, block_size=64, n_layer=1, n_head=2, n_embd=16)
    model = GPT(config).eval()
    srv = ChatServer(("127.0.0.1", 0), Endpoint(model, tok, "tiny"))
    thread = threading.Thread(target=srv.serve_forever, daemon=True)
    thread.start()
    yield srv
    srv.shutdown()
    srv.server_close()


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.url, api_key="unused", max_retries=0, timeout=30)


MESSAGES = [{"role": "system", "content": "be brief."}, {"role": "user", "content": "spell cat."}]


def test_models_and_a_whole_chat_answer(client):
    assert [m.id for m in client.models.list().data] == ["tiny"]
    r = client.chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=5, temperature=0)
    choice = r.choices[0]
    assert r.object == "chat.completion" and choice.message.role == "assistant"
    assert choice.finish_reason in ("stop", "length") and r.usage.completion_tokens <= 5
    assert r.usage.prompt_tokens > 0 and isinstance(choice.message.content, str)


def test_streaming_gives_the_same_text_as_a_whole_answer(client):
    kw = dict(model="tiny", messages=MESSAGES, max_tokens=8, temperature=0.9, top_p=0.9, seed=7)
    whole = client.chat.completions.create(**kw).choices[0].message.content
    chunks = list(client.chat.completions.create(stream=True, **kw))
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == whole
    assert chunks[-1].choices[0].finish_reason in ("stop", "length")
    assert client.chat.completions.create(**kw).choices[0].message.content == whole  # the seed


def test_text_completions_streamed_and_whole_and_stop_strings(client):
    r = client.completions.create(model="tiny", prompt="abc", max_tokens=6, temperature=0)
    text = r.choices[0].text
    assert r.object == "text_completion" and r.usage.completion_tokens == 6
    chunks = client.completions.create(model="tiny", prompt="abc", max_tokens=6, temperature=0,
                                       stream=True)
    streamed = "".join(c.choices[0].text for c in chunks)
    assert streamed == text
    if len(text) > 2:
        cut = client.completions.create(model="tiny", prompt="abc", max_tokens=6, temperature=0,
                                        stop=text[2])
        assert cut.choices[0].text == text[:text.index(text[2])]
        assert cut.choices[0].finish_reason == "stop"


@pytest.mark.parametrize("kw, param", [
    ({"messages": []}, "messages"),
    ({"messages": [{"role": "robot", "content": "x"}]}, "messages"),
    ({"messages": MESSAGES, "temperature": 3}, "temperature"),
    ({"messages": MESSAGES, "max_tokens": 0}, "max_tokens"),
    ({"messages": MESSAGES, "n": 2}, "n"),
    ({"messages": [{"role": "user", "content": "\u00e9"}]}, "messages"),
    ({"messages": [{"role": "user", "content": "a" * 80}]}, "messages"),
])
def test_bad_requests_are_openai_shaped_400s(client, kw, param):
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model="tiny", **kw)
    assert e.value.status_code == 400
    assert e.value.body["type"] == "invalid_request_error" and e.value.body["param"] == param


def test_requests_queue_rather_than_fail(client):
    results, errors = [], []

    def ask(i):
        try:
            r = client.chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=6,
                                               seed=i)
            results.append(r.choices[0].finish_reason)
        except Exception as e:  # noqa: BLE001 - collected: the test says which
            errors.append(e)
    threads = [threading.Thread(target=ask, args=(i,)) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors and len(results) == 6


@pytest.mark.parametrize("headers", [{"Host": "evil.example"}, {"Origin": "http://evil.example"}])
def test_another_site_is_refused(server, headers):
    port = server.server_address[1]
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    body = json.dumps({"model": "tiny", "messages": MESSAGES})
    conn.request("POST", "/v1/chat/completions", body,
                 {"Content-Type": "application/json", **headers})
    r = conn.getresponse()
    assert r.status == 403 and "error" in json.loads(r.read())
