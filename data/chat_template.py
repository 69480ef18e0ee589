"""The chat template: how a conversation becomes token ids, and which of them are learnt.

A template is a Jinja string, as Hugging Face's `chat_template` is, so one rendering serves
training, sample.py --chat, the endpoint and the export (transformers' `apply_chat_template` reads
the same string). tinygpt's own is four special tokens added after any tokenizer's ids (characters,
GPT-2 BPE, the own BPE):

    <|system|>You are terse.<|end|><|user|>Spell cat<|end|><|assistant|>c-a-t<|end|>

An imported Llama/Qwen3 directory keeps the template and the tokens it came with (`with_chat` never
replaces one). The description `{"template", "special", "end"}` rides in the tokenizer's `to_dict()`
under "chat", so every checkpoint and prepared directory carries it.

The loss mask: each turn is rendered as the conversation grew, and each added piece is encoded on
its own, so an answer's tokens (its content and its end-of-turn token) are known exactly; the
prompt's are not learnt.
"""
from __future__ import annotations

from functools import lru_cache

SPECIAL = ("<|system|>", "<|user|>", "<|assistant|>", "<|end|>")
END = "<|end|>"
TEMPLATE = ("{%- for message in messages -%}{{- '<|' + message['role'] + '|>' + message['content'] "
            "+ '<|end|>' -}}{%- endfor -%}{%- if add_generation_prompt -%}{{- '<|assistant|>' "
            "-}}{%- endif -%}")


def tinygpt_chat() -> dict:
    """tinygpt's own template's description."""
    return {"template": TEMPLATE, "special": list(SPECIAL), "end": END}


def with_chat(tokenizer: dict) -> dict:
    """A tokenizer description with a chat template: its own if it has one, else tinygpt's (4 ids
    added)."""
    if isinstance(tokenizer.get("chat"), dict):
        return tokenizer
    return {**tokenizer, "chat": tinygpt_chat()}


def without_chat(tokenizer: dict) -> dict:
    """A tokenizer description without its chat template (plain text fine-tunes an imported model's
    base)."""
    return {k: v for k, v in tokenizer.items() if k != "chat"}


def has_chat(tokenizer) -> bool:
    """Whether a built tokenizer carries a chat template."""
    return isinstance(getattr(tokenizer, "chat", None), dict)


@lru_cache(maxsize=8)
def _compile(template: str):
    """The template compiled as transformers compiles it (a sandbox, trim_blocks, lstrip_blocks,
    loop controls)."""
    import jinja2
    import jinja2.ext
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def raise_exception(message):
        raise ValueError(f"the chat template refused the conversation: {message}")
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[jinja2.ext.loopcontrols])
    env.globals["raise_exception"] = raise_exception
    try:
        return env.from_string(template)
    except jinja2.TemplateError as e:
        raise ValueError(f"the chat template is not valid Jinja ({e}): the checkpoint's tokenizer "
                         "is damaged") \
            from None


class ChatFormat:
    """A tokenizer's chat template applied: `render` (text), `encode` (ids and the loss mask),
    `prompt`, `stop_ids`."""

    def __init__(self, tokenizer):
        if not has_chat(tokenizer):
            raise ValueError("this model has no chat template (a base model): fine-tune it on "
                             "conversations first (python train.py experiment=sft_cpu ...; "
                             "docs/chat.md)")
        self.tokenizer, self.chat = tokenizer, tokenizer.chat
        self.template = _compile(self.chat["template"])
        # an imported template's bos_token, eos_token, ...
        self.special = dict(self.chat.get("tokens", {}))
        ends = [self.chat.get("end")] + [t for t in self.chat.get("stop", [])]
        self.stop_ids = sorted({i for t in ends if t for i in self._single_id(t)})

    def _single_id(self, text: str) -> list[int]:
        ids = self.tokenizer.encode(text)
        return ids if len(ids) == 1 else []

    def render(self, messages: list[dict], add_generation_prompt: bool = False) -> str:
        return self.template.render(messages=messages, add_generation_prompt=add_generation_prompt,
                                    **self.special)

    def encode(self, messages: list[dict],
               add_generation_prompt: bool = False) -> tuple[list[int], list[int]]:
        """(ids, mask): mask 1 on each assistant answer's tokens (its end-of-turn token included),
        else 0."""
        ids, mask, done = [], [], ""

        def add(text: str, learn: bool) -> None:
            nonlocal done
            if not text.startswith(done):
                raise ValueError("the chat template renders a conversation differently as it grows "
                                 "(an earlier turn changes): its answers cannot be told from its "
                                 "prompts")
            piece = self.tokenizer.encode(text[len(done):])
            ids.extend(piece)
            mask.extend([int(learn)] * len(piece))
            done = text
        for i, m in enumerate(messages):
            if m["role"] == "assistant":
                add(self.render(messages[:i], True), False)
            add(self.render(messages[:i + 1]), m["role"] == "assistant")
        if add_generation_prompt:
            add(self.render(messages, True), False)
        return ids, mask

    def prompt(self, messages: list[dict]) -> list[int]:
        """The ids that ask the model for the next answer."""
        return self.encode(messages, add_generation_prompt=True)[0]
