import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import pytest

from stability.datasets import Dataset, load_dataset

#: A small data set of the seed's kind: a few seconds of training at most.
TINY_DATA = {"num_graphs": 48, "min_nodes": 3, "max_nodes": 7, "seed": 0}

TINY_CASE = """
name = "tiny"
variants = ["raw_e", "stable_softmax"]
seeds = [0]
batch_sizes = [16]
learning_rates = [0.01]
epochs = 2

[model]
hidden = 8

[dataset]
name = "synthetic"
num_graphs = 48
min_nodes = 3
max_nodes = 7
"""


@pytest.fixture(scope="session")
def tiny_dataset() -> Dataset:
    return load_dataset("synthetic", **TINY_DATA)
