"""common.cli: a user mistake is one line and exit 2; a reader that leaves (`| head`) ends every CLI quietly,
exit 141 (128 + SIGPIPE, as the shell reports for `seq 1000000 | head -1`): no traceback, no "Exception
ignored" at exit. The subprocess test gives each command a stdout pipe whose reader has already gone, so
the first write or the final flush always fails (no race with a real `head`). (With PYTHONUNBUFFERED set,
argparse's --help swallows the error itself and exits 0, as quietly.) A setting error says its settings in the
raiser's names until an edge renames them."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

from common.cli import (EXIT_BROKEN_PIPE, ArgumentParser, cli_main, exit_quietly_on_broken_pipe, in_keys,
                        nanogpt_init_from, setting_error)
from common.platform import script
from tests.helpers import REPO


def test_a_broken_pipe_exits_141_quietly(capsys):
    def run(argv):
        raise BrokenPipeError(32, "Broken pipe")
    assert EXIT_BROKEN_PIPE == 141 and cli_main(run, []) == 141  # it was 1
    assert capsys.readouterr().err == ""


def test_the_final_flush_is_inside_the_guard(monkeypatch):
    """Output still buffered when main returns (a pipe is block-buffered) fails only at the flush."""
    class Gone:
        def write(self, s):
            return len(s)

        def flush(self):
            raise BrokenPipeError(32, "Broken pipe")
    monkeypatch.setattr(sys, "stdout", Gone())
    assert cli_main(lambda argv: 0, []) == 141
    assert exit_quietly_on_broken_pipe(lambda: sys.exit(0)) == 141  # argparse's --help


def test_mistakes_and_exit_codes_pass_through(capsys):
    def mistake(argv):
        raise ValueError("--x 3 is invalid: use 2")
    assert cli_main(mistake, []) == 2 and capsys.readouterr().err == "error: --x 3 is invalid: use 2\n"
    assert cli_main(lambda argv: 0, []) == 0
    assert exit_quietly_on_broken_pipe(lambda: sys.exit(3)) == 3


def test_another_spelling_of_a_flag_is_told_the_one_to_write():
    """Issue 43: nanoGPT's flags (and ours with underscores) got argparse's "unrecognized arguments" in every CLI but
    train.py; the parser tells the flag to write, the value quoted for the shell."""
    p = ArgumentParser(prog="x.py", spellings={"out_dir": "--run", "init_from": nanogpt_init_from("--init")})
    p.add_argument("--run")
    p.add_argument("--init")
    p.add_argument("--max-new-tokens", type=int)
    p.add_argument("--compile", action="store_true")
    for argv, said in ((["--max_new_tokens=5"], "x.py takes --max-new-tokens 5, not --max_new_tokens=5"),
                       (["--out_dir", "a b", "--run", "c"], "x.py takes --run 'a b', not --out_dir a b"),
                       (["--compile_it"], "unrecognized arguments: --compile_it"),  # no spelling of ours
                       (["--compile_=1"], "unrecognized arguments: --compile_=1"),
                       (["--compile=False"], "--compile=False: --compile takes no value: write --compile alone, or "
                                             "leave it out"),
                       (["--init_from=gpt2"], "x.py takes --init gpt2 (a local Hugging Face directory), not "
                                              "--init_from=gpt2")):
        with pytest.raises(ValueError) as info:
            p.parse_args(argv)
        assert str(info.value) == f"{said} (see python {script('x.py')} --help)"  # (a path that runs from here)
    assert p.parse_args(["--max-new-tokens", "5", "--compile"]).max_new_tokens == 5


@pytest.mark.slow
def test_every_cli_ends_quietly_when_the_reader_leaves(tmp_path):
    from data.tokenizer import CharTokenizer
    from tests.helpers import save_run, tiny_model
    text = "KING:\nGood night, sweet prince, and flights of angels sing thee to thy rest.\n" * 20
    (tmp_path / "t.txt").write_text(text)
    tok = CharTokenizer(text)
    save_run(tmp_path / "run", tiny_model(tok.vocab_size), tok)
    run = ["--run", str(tmp_path / "run")]
    commands = [["sample.py", *run, "--max-new-tokens", "50"], ["sample.py", "--help"],
                ["eval.py", "--file", "t.txt", *run], ["export.py", "--hf", "hf", *run], ["bench.py", "--help"],
                ["-m", "data.prepare", "--data", "text", "--path", "t.txt", "--quiet"]]
    env = dict(os.environ, PYTHONPATH=str(REPO), OMP_NUM_THREADS="1")
    env.pop("PYTHONUNBUFFERED", None)  # a pipe is block-buffered, as in a shell: output waits for the last flush
    for argv in commands:
        read, write = os.pipe()
        os.close(read)  # the reader has left before the command writes a byte
        try:
            script = [str(REPO / argv[0])] if argv[0].endswith(".py") else argv[:2]
            proc = subprocess.run([sys.executable, *script, *argv[len(script):]], stdout=write,
                                  stderr=subprocess.PIPE, text=True, cwd=tmp_path, env=env, timeout=300)
        finally:
            os.close(write)
        assert proc.returncode == 141, (argv, proc.returncode, proc.stderr)
        assert "Traceback" not in proc.stderr and "Exception ignored" not in proc.stderr, (argv, proc.stderr)
        assert "error" not in proc.stderr, (argv, proc.stderr)


def test_setting_error_names_its_settings_and_keeps_its_type():
    e = setting_error("{path=}{0} does not exist: point {path} at a file ({1!r})", "a{b}.txt", 1,
                      cls=FileNotFoundError)
    assert type(e) is FileNotFoundError and str(e) == "path=a{b}.txt does not exist: point path at a file (1)"
    for keys, said in (({"path": "data.path"}, "data.path=a{b}.txt does not exist: point data.path at a file (1)"),
                       ({"path": "--path"}, "--path a{b}.txt does not exist: point --path at a file (1)")):
        with pytest.raises(FileNotFoundError) as info, in_keys(keys):
            raise e
        assert str(info.value) == said


def test_in_keys_passes_other_errors_through_and_decorates():
    plain = ValueError("path=x is wrong")
    with pytest.raises(ValueError) as info, in_keys({"path": "data.path"}):
        raise plain
    assert info.value is plain

    @in_keys({"n": "model.n"})
    def build(n):
        raise setting_error("{n=}{0} must be positive", n)

    with pytest.raises(ValueError, match="^model.n=0 must be positive$"):
        build(0)


def test_count_says_one_layer_and_two_layers():
    from common.cli import count
    assert (count(1, "layer"), count(2, "head"), count(0, "token")) == ("1 layer", "2 heads", "0 tokens")


def test_a_sibling_clis_name_for_the_same_flag_is_told_ours(monkeypatch):
    """Issue 43: eval.py names a Hugging Face directory --hf, sample.py and explore.py --init; the other one got
    argparse's bare "unrecognized arguments" (and eval.py's --out_dir, with no --file, "--file is required")."""
    import eval as eval_cli
    import explore
    import sample
    monkeypatch.chdir(REPO)
    for parse, argv, said in ((sample.parse_args, ["--hf", "gpt2"], "sample.py takes --init gpt2, not --hf gpt2"),
                              (explore.parse_args, ["--hf=gpt2"], "explore.py takes --init gpt2, not --hf=gpt2"),
                              (eval_cli.parse_args, ["--init", "gpt2"], "eval.py takes --hf gpt2, not --init gpt2"),
                              (eval_cli.parse_args, ["--out_dir", "o"], "eval.py takes --run o, not --out_dir o")):
        with pytest.raises(ValueError) as info:
            parse(argv)
        assert str(info.value) == f"{said} (see python {parse.__module__}.py --help)"
