"""Map-style datasets that DataLoader workers read: in a module of their own, importing only NumPy and
PyTorch, so that a spawned worker unpickling one does not import the test module (JAX, jaxtrain, Grain,
Hugging Face datasets: several seconds a worker)."""

import os
import signal

import numpy as np
import torch


class OpensOnFirstUse:
    """Opens its file on first use (as one over HDF5 does), in whichever process reads it."""

    opened_in = None

    def __init__(self, data: dict[str, np.ndarray]):
        self.data = data

    def __len__(self):
        return len(self.data["x"])

    def __getitem__(self, i):
        self.opened_in = self.opened_in or os.getpid()
        return {k: v[i] for k, v in self.data.items()}


class Crashing(torch.utils.data.Dataset):
    """Raises at sample 50, as a corrupt record would."""

    def __init__(self, data: dict[str, np.ndarray]):
        self.data = data

    def __len__(self):
        return len(self.data["x"])

    def __getitem__(self, i):
        if i == 50:
            raise ValueError("corrupt record 50")
        return {k: torch.from_numpy(v[i]) for k, v in self.data.items()}


class Dying(Crashing):
    """Its worker dies at sample 50 (out of memory, a crash in native code)."""

    def __getitem__(self, i):
        if i == 50:
            os.kill(os.getpid(), signal.SIGKILL)
        return super().__getitem__(i - 1)
