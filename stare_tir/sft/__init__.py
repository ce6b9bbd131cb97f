"""Cold-start SFT: the stage of a training run (`stage`), its training loop (`train`) and settings (`config`)."""
