import os
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "rollout"))
from rollout_helpers import make_tokenizer  # noqa: E402


@pytest.fixture(scope="session")
def tokenizer():
  return make_tokenizer()
