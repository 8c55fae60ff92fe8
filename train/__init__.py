"""PyTorch training of the ISAN (and baselines). Needs the ``train`` extra (torch)."""
