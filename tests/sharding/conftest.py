import os
import sys

# Reuse the tiny-HF-model fixture and helpers of tests/models.
sys.path.insert(
  0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "models")
)
from conftest import hf_models  # noqa: E402,F401  (tests/models/conftest.py)
