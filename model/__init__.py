"""tinygpt's model: a GPT-2-style transformer (GPT, GPTConfig), its KV cache and its sampler.
Framework-free: nothing here imports Hydra, data/ or training/."""
from model.config import GPTConfig
from model.gpt import GPT
from model.kv_cache import KVCache

__all__ = ["GPT", "GPTConfig", "KVCache"]
