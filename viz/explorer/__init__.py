"""The attention explorer behind `python explore.py`: a local web page that shows what a checkpoint's attention does."""
