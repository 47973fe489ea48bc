"""Training the drafters of this harness on a target's own answers: `python -m graft.train eagle3|dflash`.

- generate.py, prompts.py: the data stage both share (the target answers non-evaluation requests itself);
- features.py: one target pass per conversation records the features a drafter reads;
- fit.py: the fit loop both share (optimizer, schedule, checkpoints, resume, logging, held-out selection);
- eagle3.py, dflash.py: each drafter's head, loss step and export (losses in graft/draft_models/eagle/train.py and
  graft/draft_models/dflash/train.py).
"""
