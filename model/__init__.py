"""tinygpt's model: `from model import GPT, GPTConfig`, as in nanoGPT. The two names load on first
use (PEP 562), so `import model.config` stays free of torch: sample.py checks its arguments before
torch is imported. Nothing here imports Hydra, data/ or training/."""


def __getattr__(name: str):
    if name == "GPT":
        from model.gpt import GPT
        return GPT
    if name == "GPTConfig":
        from model.config import GPTConfig
        return GPTConfig
    raise AttributeError(f"module 'model' has no attribute {name!r}")
