"""The VSNAP_* environment variables the plugin reads, read here and nowhere else. Each is read
when it is used, so a test may set it first; an empty value counts as unset. docs/vllm-plugin.md
says what each does."""

import os

# What each accepts and what holds when it is unset.
SETTINGS = {
    "VSNAP_RAM_TIER": {
        "accepts": "the directory of a RAM tier (on tmpfs) made by `python3 -m vsnap_vllm.ram_tier init <dir> --budget <bytes>`",
        "default": "none: the vsnap sleep-mode backend sleeps and wakes as vLLM's cumem backend, said in one log line",
    },
}


def _raw(name, env):
    value = (os.environ if env is None else env).get(name)
    return value if value else None


def ram_tier_dir(env=None):
    """VSNAP_RAM_TIER: the RAM tier the `vsnap` sleep-mode backend keeps sleeping weights in
    (shared by every engine of the host started with the same directory), or None."""
    return _raw("VSNAP_RAM_TIER", env)
