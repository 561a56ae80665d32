"""Puts the reference engine's stand-in `vllm` package (test/fixtures/engine) on sys.path, with
host memory, so the plugin's real code runs against an allocator shaped like vLLM's."""

import os
import sys

os.environ.setdefault("VSNAP_REF_DEVICE", "host")
os.environ.setdefault("VSNAP_VLLM_HOST_MEMORY", "1")
ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))
FIXTURE = os.path.join(ROOT, "test", "fixtures", "engine")
if FIXTURE not in sys.path:
    sys.path.insert(0, FIXTURE)
PLUGIN = os.path.join(ROOT, "engines", "vllm")
if PLUGIN not in sys.path:
    sys.path.insert(0, PLUGIN)
