"""A map-style dataset that opens its file on first use (as one over HDF5 does), in whichever process
reads it; in a module of its own, so that a spawned DataLoader worker imports little to unpickle it."""

import os

import numpy as np


class OpensOnFirstUse:
    opened_in = None

    def __init__(self, data: dict[str, np.ndarray]):
        self.data = data

    def __len__(self):
        return len(self.data["x"])

    def __getitem__(self, i):
        self.opened_in = self.opened_in or os.getpid()
        return {k: v[i] for k, v in self.data.items()}
