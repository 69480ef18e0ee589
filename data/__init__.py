"""Data: everything between a text file and a batch of token ids on the device.

config (DataConfig, also the Hydra `data` node), sources (cache directory, downloads, GPT-2 ranks), tokenizer,
corpus (reading the text), encode (streamed tokenization), cache (prepared-data directories), prepare
(`prepare(cfg)` and its CLI), loader (token files, batches), hf_tokenizer (tokenizer files for an export).
Imports neither hydra nor model/ nor training/.
"""
