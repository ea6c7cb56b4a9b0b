"""Sample banks: the model's real samples, stored to be replayed exactly (store.py) and built with a live model (build.py)."""
