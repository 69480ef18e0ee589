"""Standard benchmark evaluations of a trained model (HellaSwag), shared by eval.py and the training loop."""
