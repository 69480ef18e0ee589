"""Data: everything between a text file and a batch of token ids on the device.

Imports neither hydra, model/ nor training/: its errors name DataConfig's fields (path=...); callers rename them.
"""
