"""Pictures, and the one home of matplotlib: attention maps (sample.py) and loss curves (training)."""
