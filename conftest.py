"""Test setup shared by every test: quiet TensorFlow, repo root importable."""

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
