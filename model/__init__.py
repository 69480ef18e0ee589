"""tinygpt's model: a GPT-style decoder (model.gpt), its shape (model.config) and its sampler (model.generate).
Framework-free: nothing here imports Hydra, data/ or training/."""
