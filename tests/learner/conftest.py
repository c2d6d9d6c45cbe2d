"""Makes the learner test helpers (learner_toy_model) importable under --import-mode=importlib."""

import os
import sys

sys.path.insert(0, os.path.dirname(__file__))  # tests are not a package
