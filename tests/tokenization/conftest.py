import os
import sys

import pytest

_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(_HERE, "..", "rollout"))
sys.path.insert(0, _HERE)  # qwen3_reference
from rollout_helpers import make_tokenizer  # noqa: E402


@pytest.fixture(scope="session")
def tokenizer():
  return make_tokenizer()
