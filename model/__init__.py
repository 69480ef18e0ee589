"""tinygpt's model: a GPT-2-style transformer (model.gpt), its shape (model.config) and its sampler (model.generate).
Framework-free: nothing here imports Hydra, data/ or training/."""
from model.config import GPTConfig
from model.gpt import GPT

__all__ = ["GPT", "GPTConfig"]
