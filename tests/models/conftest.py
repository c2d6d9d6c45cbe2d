"""Shared fixture: tiny random transformers checkpoints saved into tmp dirs (no hub)."""

import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(__file__))  # for model_test_utils (tests are not a package)
from model_test_utils import CASES, MOE_CASES, build_torch_model  # noqa: E402


@pytest.fixture(scope="session")
def hf_models(tmp_path_factory):
  """Lazily built {case: (hf_dir, torch_model)} cache for the whole session."""
  cache = {}

  def get(case: str):
    if case not in cache:
      model_type, kw = {**CASES, **MOE_CASES}[case]
      model = build_torch_model(model_type, kw)
      d = tmp_path_factory.mktemp(case)
      model.save_pretrained(d)
      cache[case] = (str(d), model)
    return cache[case]

  return get
