"""Data: everything between a text file and a batch of token ids on the device.

Modules: config (DataConfig), sources (cache directory, downloads), tokenizer, corpus, encode, cache, prepare
(`prepare(cfg)` and its CLI), loader (token files, batches), hf_tokenizer. Imports neither hydra, model/ nor training/.
"""
