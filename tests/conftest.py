"""Shared fixtures: the built-in toy task (the canonical instance committed in toy/)."""

import os

import pytest
import torch

import toy_task

torch.set_num_threads(max(1, min(2, os.cpu_count() or 1)))


@pytest.fixture(scope="session")
def toy() -> toy_task.ToyPaths:
    return toy_task.load()
