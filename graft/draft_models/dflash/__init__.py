"""DFlash-style block drafters: the model (model.py), the published checkpoint layout (checkpoint.py) and
training (train.py). The draft source that uses them is graft/methods/dflash.py."""
