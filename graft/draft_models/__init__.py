"""The draft models: the EAGLE-3 head (eagle/) and the DFlash block drafter (dflash/), each with its checkpoint reader and training loss."""
