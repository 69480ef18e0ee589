"""Training: the loop and everything it needs, kept apart from the model, the data and the
checkpoints. Nothing is imported eagerly here, so importing one module stays cheap (the map of
modules: docs/design.md).
"""
