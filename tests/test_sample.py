"""sample.py end to end on a tiny model trained here, plus unit tests of its streaming and run lookup.

Most CLI tests call `sample.main(argv)` in-process (the same code path as `python sample.py`, minus
the 2-3 s torch import per subprocess); a few go through a real subprocess to prove the script's
wiring: exit codes, one-line errors, no traceback, Ctrl-C.
"""
from __future__ import annotations

import os
import random
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

import sample
from tests.helpers import REPO, run_cli

PROMPT = "ROMEO:\n"
REPORT = re.compile(r"^generated (\d+) tokens in [\d.]+ s \([\d.]+ tokens/s, kv cache (on|off)(?:, compiled|, CUDA graphs)?\)$")
RUN_REL = Path("outputs") / "2026-01-01" / "00-00-00"


def _corpus() -> str:
    rng = random.Random(1234)
    words = ["the", "king", "queen", "sword", "love", "night", "day", "speak", "thou", "art",
             "my", "lord", "good", "fair", "what", "is", "this", "come", "go", "away"]
    lines = []
    while sum(len(s) for s in lines) < 20_000:
        speaker = rng.choice(["ROMEO", "JULIET", "KING", "NURSE"])
        sent = " ".join(rng.choice(words) for _ in range(rng.randint(4, 12)))
        lines.append(f"{speaker}:\n{sent.capitalize()}{rng.choice('.!?,;')}\n\n")
    return "".join(lines)


def _train_tiny(steps: int = 200):
    """A 2-layer, 32-wide char GPT (context 32) trained for a few hundred steps with plain torch."""
    from data.tokenizer import CharTokenizer
    from model.config import GPTConfig
    from model.gpt import GPT

    text = _corpus()
    tok = CharTokenizer(text)
    data = torch.tensor(tok.encode(text), dtype=torch.long)
    cfg = GPTConfig(vocab_size=tok.vocab_size, block_size=32, n_layer=2, n_head=2, n_embd=32)
    torch.manual_seed(0)
    model = GPT(cfg)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    g = torch.Generator().manual_seed(0)
    for _ in range(steps):
        ix = torch.randint(len(data) - cfg.block_size - 1, (32,), generator=g)
        x = torch.stack([data[i:i + cfg.block_size] for i in ix])
        y = torch.stack([data[i + 1:i + 1 + cfg.block_size] for i in ix])
        _, loss = model(x, y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
    return model.eval(), tok, loss.item()


def _checkpoint(model, tok, loss) -> dict:
    return {"format": "tinygpt", "version": 1, "model": model.state_dict(),
            "model_config": model.config.to_dict(), "tokenizer": tok.to_dict(), "optimizer": {},
            "scaler": None, "step": 200, "best_val_loss": loss, "config": {}, "rng": {}, "loader": {},
            "wandb_run_id": None}


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    """Tiny models: a second intra-op thread only adds overhead, and stalls when other jobs share the CPU."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def trained(tmp_path_factory, _one_thread):
    """(project dir with outputs/2026-01-01/00-00-00/best.pt, checkpoint path, tokenizer, final loss)."""
    from checkpoint.file import save_checkpoint

    model, tok, loss = _train_tiny()
    project = tmp_path_factory.mktemp("project")
    (project / RUN_REL).mkdir(parents=True)
    path = project / RUN_REL / "best.pt"
    save_checkpoint(_checkpoint(model, tok, loss), path)
    return project, path, tok, loss


def sample_main(capsys, *args) -> tuple[int, str, str]:
    code = sample.main([str(a) for a in args])
    out, err = capsys.readouterr()
    return code, out, err


def samples_of(stdout: str) -> list[str]:
    assert stdout.endswith("\n")
    return stdout[:-1].split(sample.SEPARATOR)


def report_of(stderr: str) -> tuple[int, str]:
    m = REPORT.match(stderr.strip().splitlines()[-1])
    assert m, f"last stderr line is not the report: {stderr!r}"
    return int(m.group(1)), m.group(2)


# ------------------------------------------------------------------------------------- CLI: happy path
@pytest.mark.slow  # over ~1 s
def test_tiny_model_learned_something(trained):
    assert trained[3] < 1.3  # a model that learned the corpus makes the other tests meaningful


def test_output_starts_with_prompt_and_reports(trained, capsys):
    code, out, err = sample_main(capsys, "--checkpoint", trained[1], "--prompt", PROMPT,
                                 "--max-new-tokens", 40, "--seed", 1)
    assert code == 0, err
    assert out.startswith(PROMPT)
    assert len(out) == len(PROMPT) + 40 + 1  # char model: one char per token, plus the final newline
    assert report_of(err) == (40, "on")


def test_seed_makes_it_reproducible(trained, capsys):
    runs = [sample_main(capsys, "--checkpoint", trained[1], "--prompt", PROMPT, "--max-new-tokens", 60,
                        "--seed", s, "--temperature", 1.0)[1] for s in (7, 7, 8)]
    assert runs[0] == runs[1]
    assert runs[0] != runs[2]


def test_greedy_is_deterministic_and_cache_matches_no_cache(trained, capsys):
    # 80 new tokens with a context of 32: the window slides, on both paths
    args = ["--checkpoint", trained[1], "--prompt", PROMPT, "--max-new-tokens", 80, "--temperature", 0]
    cached = [sample_main(capsys, *args, "--seed", s) for s in (1, 2)]
    uncached = sample_main(capsys, *args, "--no-kv-cache")
    assert cached[0][1] == cached[1][1] == uncached[1]
    assert report_of(uncached[2]) == (80, "off")


@pytest.mark.parametrize("t", ["1e-45", "5e-324", "1e-30"])
def test_a_tiny_temperature_prints_the_greedy_text(trained, capsys, t):
    """Was the prompt and a newline per token (NaN probabilities), exit 0: too small to divide by is greedy."""
    args = ["--checkpoint", trained[1], "--prompt", PROMPT, "--max-new-tokens", 60]
    greedy = sample_main(capsys, *args, "--temperature", 0)[1]
    for more in ([], ["--top-k", 5, "--top-p", 0.9, "--seed", 3], ["--no-kv-cache"]):
        code, out, err = sample_main(capsys, *args, "--temperature", t, *more)
        assert code == 0 and out == greedy, (more, err)


def test_min_p_keeps_the_tokens_near_the_top_one(trained, capsys):
    """--min-p P keeps the tokens at least P times as likely as the top one: 1 keeps only the top one, so a hot
    temperature prints the greedy text; a smaller P samples, the same text again with the same --seed."""
    args = ["--checkpoint", trained[1], "--prompt", PROMPT, "--max-new-tokens", 20]
    greedy = sample_main(capsys, *args, "--temperature", 0)[1]
    code, out, err = sample_main(capsys, *args, "--temperature", 1.5, "--min-p", 1, "--seed", 1)
    assert code == 0 and out == greedy, err
    a, b = (sample_main(capsys, *args, "--temperature", 1.5, "--min-p", 0.05, "--seed", 1)[1] for _ in range(2))
    assert a == b != greedy


def test_repetition_penalty_changes_the_greedy_text(trained, capsys):
    """--repetition-penalty applies at --temperature 0 too (before the argmax): 1 is the greedy
    text, a penalty another one."""
    args = ["--checkpoint", trained[1], "--prompt", PROMPT, "--max-new-tokens", 20,
            "--temperature", 0]
    greedy = sample_main(capsys, *args)[1]
    assert sample_main(capsys, *args, "--repetition-penalty", 1)[1] == greedy
    code, out, err = sample_main(capsys, *args, "--repetition-penalty", 1.5)
    assert code == 0 and out.startswith(PROMPT) and out != greedy, err


def test_stop_string_ends_the_sample(trained, capsys):
    code, out, err = sample_main(capsys, "--checkpoint", trained[1], "--prompt", PROMPT, "--max-new-tokens", 200,
                                 "--seed", 3, "--stop", r"\n")  # typed as backslash-n, as in a shell
    assert code == 0, err
    generated = out[len(PROMPT):]  # the output ends with the stop string: no newline is added after it
    assert out.startswith(PROMPT) and generated.endswith("\n") and generated.count("\n") == 1
    n, _ = report_of(err)
    assert n == len(generated) < 200  # generation stopped early


@pytest.mark.parametrize("stream", [True, False])
def test_output_ends_exactly_with_the_stop_string(trained, capsys, stream):
    """`--stop '\n\n'` (the end of a speech): the output ends with those two newlines, not three."""
    args = ["--checkpoint", trained[1], "--prompt", PROMPT, "--max-new-tokens", 300, "--seed", 3, "--stop", r"\n\n"]
    code, out, err = sample_main(capsys, *args, *([] if stream else ["--no-stream"]))
    assert code == 0, err
    generated = out[len(PROMPT):]
    assert generated.endswith("\n\n") and not generated.endswith("\n\n\n") and generated.count("\n\n") == 1
    assert report_of(err)[0] == len(generated) < 300
    code, out, err = sample_main(capsys, *args[:-2], "--max-new-tokens", 5)  # no stop string
    last = out[len(PROMPT) + 4]  # the 5th generated character: a newline is added only to end an open line
    assert code == 0 and out.endswith("\n") and len(out) == len(PROMPT) + 5 + (last != "\n")


def test_prompt_understands_the_escapes_stop_does(trained, capsys):
    code, out, err = sample_main(capsys, "--checkpoint", trained[1], "--prompt", r"ROMEO:\nJULIET:",
                                 "--max-new-tokens", 5, "--seed", 0)
    assert code == 0, err
    assert out.startswith("ROMEO:\nJULIET:")  # a real newline, as typed in a shell: ROMEO:\nJULIET:
    code, out, err = sample_main(capsys, "--checkpoint", trained[1], "--prompt", r"KING:\\n")
    assert_one_line_error(code, err, "vocabulary", repr("\\"))  # \\ is one backslash, which the model never saw


def test_num_samples_gives_separated_samples_and_no_stream_matches(trained, capsys):
    args = ["--checkpoint", trained[1], "--prompt", PROMPT, "--max-new-tokens", 30, "--num-samples", 2, "--seed", 5]
    code, out, err = sample_main(capsys, *args)
    assert code == 0, err
    two = samples_of(out)
    assert len(two) == 2 and all(s.startswith(PROMPT) and len(s) == len(PROMPT) + 30 for s in two)
    assert report_of(err)[0] == 60
    assert sample_main(capsys, *args, "--no-stream")[1] == out


def test_run_dir_top_k_clamp_and_top_p(trained, capsys):
    project, _, tok, _ = trained
    code, out, err = sample_main(capsys, "--run", project / RUN_REL, "--prompt", "KING:", "--max-new-tokens", 10,
                                 "--top-k", 100000, "--top-p", 0.9, "--seed", 0)
    assert code == 0, err
    assert out.startswith("KING:") and f"using {project / RUN_REL / 'best.pt'}" in err


def test_long_prompt_is_cut_with_a_notice(trained, capsys):
    long_prompt = "KING:\nGood night my lord, the queen is fair and the sword is away.\n" * 2  # > 32 tokens
    code, out, err = sample_main(capsys, "--checkpoint", trained[1], "--prompt", long_prompt,
                                 "--max-new-tokens", 5, "--seed", 0)
    assert code == 0, err
    assert out.startswith(long_prompt)  # printed in full; the model sees the last 32 tokens
    notes = [line for line in err.splitlines() if line.startswith("note:")]
    assert len(notes) == 1 and f"{len(long_prompt)} tokens" in notes[0] and "last 32" in notes[0]


def test_prompt_file_and_default_prompt(trained, capsys, tmp_path):
    (tmp_path / "p.txt").write_text("NURSE:\n", encoding="utf-8")
    code, out, _ = sample_main(capsys, "--checkpoint", trained[1], "--prompt-file", tmp_path / "p.txt",
                               "--max-new-tokens", 5, "--seed", 0)
    assert code == 0 and out.startswith("NURSE:\n")
    code, out, _ = sample_main(capsys, "--checkpoint", trained[1], "--max-new-tokens", 5, "--seed", 0)
    assert code == 0 and out.startswith("\n") and len(out) == 1 + 5 + 1


def test_padded_vocabulary_ids_are_never_sampled(trained, capsys, tmp_path):
    """A model trained with model.pad_vocab_to has more logits than the tokenizer has ids."""
    from model.config import GPTConfig
    from model.gpt import GPT
    from checkpoint.file import save_checkpoint
    tok = trained[2]
    cfg = torch.load(trained[1], weights_only=True)["model_config"]
    model = GPT(GPTConfig.from_dict({**cfg, "vocab_size": tok.vocab_size + 8}))
    with torch.no_grad():
        model.transformer.wte.weight[tok.vocab_size:] *= 100  # tied lm_head: padded ids would win every argmax
    save_checkpoint(_checkpoint(model, tok, 0.0), tmp_path / "padded.pt")
    code, out, err = sample_main(capsys, "--checkpoint", tmp_path / "padded.pt", "--prompt", PROMPT,
                                 "--max-new-tokens", 20, "--temperature", 0)
    assert code == 0, err
    assert len(out) == len(PROMPT) + 20 + 1


def test_compile_on_cpu_is_a_note(trained, capsys):
    if torch.cuda.is_available():
        pytest.skip("on a CUDA machine --compile really compiles")
    code, out, err = sample_main(capsys, "--checkpoint", trained[1], "--prompt", PROMPT, "--max-new-tokens", 5,
                                 "--compile", "--device", "cpu", "--temperature", 0)
    assert code == 0 and "note: --compile" in err and report_of(err) == (5, "on")


def test_no_cuda_graphs_and_one_host_read_per_token(trained, capsys, monkeypatch):
    """The generation loop never reads a tensor back; sample.py reads each token once, to print it.
    (On the CPU the cache reads its fill level on the host: free there; GPUs use the static cache.)"""
    calls = []
    for name in ("tolist", "item", "cpu", "numpy"):
        def spy(self, *a, _name=name, _f=getattr(torch.Tensor, name), **k):
            calls.append(_name)
            return _f(self, *a, **k)
        monkeypatch.setattr(torch.Tensor, name, spy)
    for extra in ([], ["--no-cuda-graphs"]):
        calls.clear()
        code, out, err = sample_main(capsys, "--checkpoint", trained[1], "--prompt", PROMPT, "--max-new-tokens", 50,
                                     "--seed", 2, "--device", "cpu", *extra)
        assert code == 0 and report_of(err) == (50, "on"), err
        assert calls == ["tolist"] * 50


def test_cuda_decodes_with_the_fast_step_the_flags_choose(monkeypatch):
    """On CUDA sample.py passes model/fast_decode.py's step (CUDA graphs by default, --compile, eager with
    --no-cuda-graphs or --no-kv-cache), and the report's last words name it; elsewhere the eager step."""
    import argparse

    from model.generate import next_token_probs

    def step(device="cuda", **flags):
        args = argparse.Namespace(**{"compile": False, "cuda_graphs": True, "kv_cache": True, **flags})
        return sample.decode_step(args, torch.device(device))
    monkeypatch.setattr(torch, "compile", lambda fn, **kw: fn)  # nothing is compiled here
    assert step().kind == "CUDA graphs" and step(compile=True).kind == "compiled"
    assert step(cuda_graphs=False) is step(kv_cache=False) is step("cpu") is next_token_probs
    assert REPORT.match("generated 5 tokens in 0.10 s (50.0 tokens/s, kv cache on, CUDA graphs)")


@pytest.mark.slow
def test_a_cpu_run_never_loads_the_cuda_fast_path(trained, tmp_path):
    argv = ["--checkpoint", str(trained[1]), "--max-new-tokens", "3", "--device", "cpu"]
    code = ("import sys, sample\n"
            f"assert sample.main({argv!r}) == 0\n"
            "print('fast path loaded:', 'model.fast_decode' in sys.modules)\n")
    proc = run_cli(["-c", code], cwd=tmp_path, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines()[-1] == "fast path loaded: False"


def assert_png(path: Path, min_side: int = 100) -> None:
    import matplotlib.image
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    img = matplotlib.image.imread(path)
    assert img.ndim == 3 and min(img.shape[:2]) >= min_side


@pytest.mark.slow  # over ~1 s
def test_attention_map_is_a_png_and_sampling_follows(trained, capsys, tmp_path):
    png = tmp_path / "att.png"
    code, out, err = sample_main(capsys, "--checkpoint", trained[1], "--prompt", "JULIET:\nGood night",
                                 "--attention-map", png, "--max-new-tokens", 5, "--seed", 0)
    assert code == 0, err
    assert_png(png, min_side=400)  # 2 x 2 heatmaps with 19 labelled rows and columns
    assert f"attention map written to {png}" in err
    assert out.startswith("JULIET:\nGood night") and report_of(err) == (5, "on")


# ------------------------------------------------------------------------------ newest-run discovery
def _touch(path: Path, mtime: float) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"x")
    os.utime(path, (mtime, mtime))


# (the newest-run rule itself is tested with its code, in tests/test_checkpoint_file.py)


def test_cli_uses_newest_run(trained, capsys, monkeypatch, tmp_path):
    t = time.time()
    for rel, mtime in (("outputs/2026-01-01/00-00-00/best.pt", t - 100),
                       ("outputs/2026-01-02/00-00-00/last.pt", t - 50)):
        (tmp_path / rel).parent.mkdir(parents=True)
        shutil.copy(trained[1], tmp_path / rel)
        os.utime(tmp_path / rel, (mtime, mtime))
    code, out, err = sample_main(capsys, "--prompt", PROMPT, "--max-new-tokens", 3)
    assert code == 0, err
    assert err.splitlines()[0] == "using outputs/2026-01-02/00-00-00/last.pt (newest run)"


# ---------------------------------------------------------------------------------------- bad input
def _bad_checkpoints(trained, d: Path) -> dict[str, Path]:
    good = trained[1].read_bytes()
    (d / "text.pt").write_text("these are not the weights you are looking for\n")
    (d / "truncated.pt").write_bytes(good[: len(good) // 2])
    torch.save(_Evil(), d / "pickled.pt")
    ck = torch.load(trained[1], weights_only=True)
    ck["model_config"]["n_embd"] = 64  # weights are 32 wide
    ck["model_config"]["n_head"] = 2
    torch.save(ck, d / "mismatch.pt")
    return {"text": d / "text.pt", "truncated": d / "truncated.pt", "pickled": d / "pickled.pt",
            "mismatch": d / "mismatch.pt"}


class _Evil:
    def __reduce__(self):
        return (os.system, ("echo pwned",))


def assert_one_line_error(code: int, err: str, *needles: str) -> None:
    assert code == 2, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    assert "Traceback" not in err
    for needle in needles:
        assert needle.lower() in lines[0].lower(), (needle, lines[0])


ARG_MISTAKES = [  # rejected before torch is imported: cheap even as subprocesses
    (["--temperature", "-1"], "--temperature"),
    (["--temperature", "nan"], "--temperature"),
    (["--temperature", "inf"], "--temperature"),
    (["--temperature", "hot"], "invalid float"),
    (["--top-p", "0"], "--top-p"),
    (["--top-p", "1.5"], "--top-p"),
    (["--top-k", "-1"], "--top-k -1 is invalid: use a whole number >= 0"),
    (["--min-p", "1.5"], "--min-p 1.5 is outside [0, 1]: use e.g. --min-p 0.05"),
    (["--min-p", "few"], "invalid float"),
    (["--repetition-penalty", "0"], "--repetition-penalty 0.0 is invalid: use a positive number"),
    (["--max-new-tokens", "-1"], "--max-new-tokens"),
    (["--num-samples", "0"], "--num-samples"),
    (["--prompt", "a", "--prompt-file", "p.txt"], "not allowed with"),
    (["--prompt-file", "missing.txt"], "missing.txt"),
    (["--prompt", ""], "empty"),
    (["--stop", ""], "--stop"),
    (["--checkpoint", "missing.pt"], "missing.pt"),
    (["--run", "no/such/run"], "no/such/run"),
    (["--init", "."], "config.json"),
    (["--checkpoint", "."], "is a directory"),
    (["--seed", "99999999999999999999"], "--seed 99999999999999999999 is out of range"),  # was an OverflowError
    (["--seed", "-1"], "from 0 to 18446744073709551615"),
    (["--attention-map", "."], "--attention-map . is a directory"),  # was "[Errno 21] Is a directory"
    (["--run", "x", "--checkpoint", "y"], "not allowed with"),
    (["--no-such-flag"], "unrecognized"),
    ([], f"python {REPO / 'train.py'}"),  # nothing trained under ./outputs or ./multirun (train.py runs from here)
]


@pytest.mark.parametrize("args,needle", ARG_MISTAKES, ids=[" ".join(a) or "no-run" for a, _ in ARG_MISTAKES])
def test_argument_mistakes_are_one_line_errors(args, needle, capsys):
    code, out, err = sample_main(capsys, *args)
    assert_one_line_error(code, err, needle)
    assert out == ""


def test_prompt_file_that_is_not_utf8(capsys, tmp_path):
    (tmp_path / "latin1.txt").write_bytes("Zürich".encode("latin-1"))
    assert_one_line_error(*sample_main(capsys, "--prompt-file", tmp_path / "latin1.txt")[::2], "not UTF-8")


@pytest.mark.slow
def test_argument_mistakes_as_subprocesses(tmp_path):
    """The real script: exit code 2, one line, no traceback."""
    for args, needle in ARG_MISTAKES[::3]:
        proc = run_cli(["sample.py", *args], cwd=tmp_path, timeout=60)
        assert_one_line_error(proc.returncode, proc.stderr, needle)


@pytest.mark.slow
def test_argument_mistakes_are_found_before_importing_torch(tmp_path):
    code = ("import sys, sample\n"
            "for args in (['--top-p', '2'], ['--checkpoint', 'missing.pt'], []):\n"
            "    assert sample.main(args) == 2\n"
            "print('torch imported:', 'torch' in sys.modules)\n")
    proc = run_cli(["-c", code], cwd=tmp_path, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "torch imported: False" and len(proc.stderr.strip().splitlines()) == 3


@pytest.mark.parametrize("kind,needle", [("text", "text.pt"), ("truncated", "truncated.pt"),
                                         ("pickled", "pickled.pt"), ("mismatch", "mismatch.pt")])
@pytest.mark.slow  # over ~1 s
def test_bad_checkpoints_are_one_line_errors(trained, capsys, tmp_path, kind, needle):
    path = _bad_checkpoints(trained, tmp_path)[kind]
    code, out, err = sample_main(capsys, "--checkpoint", path, "--max-new-tokens", 1)
    assert_one_line_error(code, err, needle)
    assert "pwned" not in out + err


def test_run_without_checkpoint_and_unknown_device(trained, capsys, tmp_path):
    (tmp_path / "run").mkdir()
    assert_one_line_error(*sample_main(capsys, "--run", tmp_path / "run")[::2], "best.pt or last.pt")
    assert_one_line_error(*sample_main(capsys, "--checkpoint", trained[1], "--device", "tpu9")[::2], "--device")
    if not torch.cuda.is_available():
        assert_one_line_error(*sample_main(capsys, "--checkpoint", trained[1], "--device", "cuda")[::2], "CUDA")


def test_prompt_outside_char_vocabulary_lists_the_characters(trained, capsys):
    code, out, err = sample_main(capsys, "--checkpoint", trained[1], "--prompt", "Zebra ñandú kiss")
    assert_one_line_error(code, err, "vocabulary", "'Z'", "'ñ'", "'ú'")
    assert "'k'" not in err  # only the unknown ones


def test_init_reads_a_char_export_as_eval_does(trained, capsys, tmp_path):
    """Issue 24: --init read every directory as GPT-2 BPE, so a char export (which eval.py --hf reads) failed."""
    import export
    assert export.main(["--hf", str(tmp_path / "hf"), "--checkpoint", str(trained[1])]) == 0
    capsys.readouterr()
    args = ("--prompt", "KING:", "--temperature", 0, "--max-new-tokens", 30)
    code, out, err = sample_main(capsys, "--init", tmp_path / "hf", *args)
    assert code == 0, err
    assert out == sample_main(capsys, "--checkpoint", trained[1], *args)[1]  # the same model, the same text


def test_swapped_options_get_a_hint(trained, capsys, tmp_path):
    """Issue 24: --init RUN_DIR and --run EXPORT_DIR said only what was missing, not to swap the options."""
    import export
    run_dir = trained[1].parent
    assert export.main(["--hf", str(tmp_path / "hf"), "--run", str(run_dir)]) == 0
    capsys.readouterr()
    assert_one_line_error(*sample_main(capsys, "--init", run_dir)[::2],
                          f"--init {run_dir} is a tinygpt training run, not a Hugging Face directory: "
                          f"use --run {run_dir}")
    assert_one_line_error(*sample_main(capsys, "--init", trained[1])[::2],
                          f"--init {trained[1]} is a file", f"goes with --checkpoint {trained[1]}")
    assert_one_line_error(*sample_main(capsys, "--run", tmp_path / "hf")[::2],
                          f"run directory {tmp_path / 'hf'} is a Hugging Face directory",
                          f"use --init {tmp_path / 'hf'}")


@pytest.mark.slow
def test_corrupt_checkpoint_through_the_script(trained, tmp_path):
    path = _bad_checkpoints(trained, tmp_path)["truncated"]
    proc = run_cli(["sample.py", "--checkpoint", str(path)], cwd=tmp_path, timeout=120)
    assert_one_line_error(proc.returncode, proc.stderr, "truncated.pt")
    assert proc.stdout == ""


@pytest.mark.slow
def test_ctrl_c_exits_130_without_traceback(trained, tmp_path):
    env = dict(os.environ, PYTHONPATH=str(REPO), PYTHONUNBUFFERED="1")
    proc = subprocess.Popen([sys.executable, str(REPO / "sample.py"), "--checkpoint", str(trained[1]),
                             "--prompt", PROMPT, "--max-new-tokens", "1000000"], cwd=tmp_path, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.read(len(PROMPT) + 5).startswith(PROMPT)  # it is generating
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 130 and "Traceback" not in err and out.endswith("\n")


# ------------------------------------------------------------------------------------------- units
def test_stop_at_holds_back_a_straddling_stop_string():
    s = sample.StopAt("END")
    assert s.push("abcE") == "abc"  # "E" might start "END": held back
    assert s.push("Nx") == "ENx" and not s.done  # it did not
    s = sample.StopAt("END")
    assert [s.push(p) for p in ("abE", "N", "D and more")] == ["ab", "", "END"] and s.done
    s = sample.StopAt("END")
    assert s.push("xEN") == "x" and s.push("y") == "ENy" and not s.done and s.flush() == ""
    assert sample.StopAt(None).push("anything") == "anything"


def test_unescape():
    assert sample.unescape(r"a\nb\tc\\n") == "a\nb\tc\\n"
    assert sample.unescape("plain ñ") == "plain ñ"


def test_bpe_streaming_never_emits_replacement_characters(cache_with_gpt2):
    from data.tokenizer import GPT2Tokenizer
    tok = GPT2Tokenizer()
    text = "Hello 世界! 🌍🎉 naïve café — 日本語のテキスト、𝔘𝔫𝔦𝔠𝔬𝔡𝔢 ok"
    ids = tok.encode(text)
    broken = [i for i in ids if not _valid_utf8(tok.decode_bytes([i]))]
    assert broken, "the test needs tokens that split multi-byte characters"
    pieces: list[str] = []
    n = sample.stream_text((torch.tensor([[i]]) for i in ids), tok, pieces.append)
    assert n == len(ids) and "".join(pieces) == text
    assert not any("\ufffd" in p for p in pieces)
    pieces.clear()  # a stop string inside multi-byte text: printed up to and including it, then stop
    n = sample.stream_text(iter(ids), tok, pieces.append, stop="日本")
    assert "".join(pieces) == text[: text.index("日本") + 2] and n < len(ids)


def _valid_utf8(b: bytes) -> bool:
    try:
        b.decode("utf-8")
        return True
    except UnicodeDecodeError:
        return False


def test_run_accepts_a_checkpoint_file(trained, capsys):
    """`--run RUN/best.pt` samples from that file (it said the directory does not exist)."""
    code, out, err = sample_main(capsys, "--run", trained[1], "--prompt", PROMPT, "--max-new-tokens", 3)
    assert code == 0, err
    assert out.startswith(PROMPT) and "generated 3 tokens" in err


def test_init_with_a_model_name_says_how_to_get_the_weights(capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert_one_line_error(*sample_main(capsys, "--init", "gpt2")[::2], "--init gpt2 is not a local directory",
                          "hf download openai-community/gpt2 config.json model.safetensors --local-dir gpt2")
    assert_one_line_error(*sample_main(capsys, "--init", "runs/exports/mine")[::2],  # a path: checked as one
                          "--init runs/exports/mine does not exist: check the path")


@pytest.mark.parametrize("args, fix", [
    (["--out_dir=out-shakespeare-char"], "sample.py takes --run out-shakespeare-char, not --out_dir="),
    (["--out_dir", "my runs/a"], "sample.py takes --run 'my runs/a', not --out_dir my runs/a"),
    (["--start=ROMEO:"], "sample.py takes --prompt ROMEO:, not --start=ROMEO:"),
    (["--start=FILE:prompt.txt"], "sample.py takes --prompt-file prompt.txt, not --start=FILE:prompt.txt"),
    (["--num_samples=3", "--max_new_tokens=50"], "sample.py takes --num-samples 3, not --num_samples=3"),
    (["--top_k", "200"], "sample.py takes --top-k 200, not --top_k 200"),
    (["--init_from=gpt2-xl"], "sample.py takes --init gpt2-xl (a local Hugging Face directory)"),
    (["--init_from=resume"], "sample.py takes --run DIR (the run directory: nanoGPT's out_dir)"),
    (["--dtype=bfloat16"], "sample.py takes no dtype option"),
    (["--compile=False"], "--compile=False: --compile takes no value: write --compile alone, or leave it out"),
])
def test_nanogpts_sample_flags_are_told_ours(capsys, args, fix):
    """Issue 43: nanoGPT's `python sample.py --out_dir=... --start=...` got "unrecognized arguments" where train.py
    translates nanoGPT's flags (launch/overrides.py): each gets the flag to write (common.cli.ArgumentParser)."""
    assert_one_line_error(*sample_main(capsys, *args)[::2], fix)


@pytest.mark.slow  # starts Python processes
def test_sampling_imports_no_compiler_and_no_fsdp(trained, tmp_path):
    """Issue 37: a sample that does not compile imports no torch._dynamo, sympy or FSDP (seconds on a GPU machine's
    first token): `python -X importtime` lists every module a process imports."""
    path, text = trained[1], tmp_path / "text.txt"
    text.write_text(_corpus()[:2000], encoding="utf-8")
    for script in (["sample.py", "--checkpoint", str(path), "--max-new-tokens", "3"],
                   ["eval.py", "--checkpoint", str(path), "--file", str(text)]):
        proc = subprocess.run([sys.executable, "-X", "importtime", str(REPO / script[0]), *script[1:]], cwd=tmp_path,
                              capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, proc.stderr[-2000:]
        imported = {ln.rsplit("|", 1)[1].strip() for ln in proc.stderr.splitlines() if ln.startswith("import time:")}
        assert "torch" in imported and not {"torch._dynamo", "sympy", "torch.distributed.fsdp"} & imported, script[0]
