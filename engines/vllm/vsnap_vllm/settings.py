"""Every VSNAP_* environment variable the plugin reads, read and checked here and nowhere else
(tests/test_settings.py fails on a read in another module of the plugin). Each is read when it is
used, so a test may set it first; an empty value counts as unset. A value a variable does not
accept raises SettingError (code E_CONFIG, as the SDK's), naming the variable and what it accepts.
docs/configuration.md lists the same variables."""

import os

# What each accepts and what holds when it is unset (docs/configuration.md says the same).
SETTINGS = {
    "VSNAP_TOKEN": {
        "accepts": "the bearer token every /vsnap/v1 request must carry",
        "default": "none: the /vsnap/v1 routes answer 503 and do nothing",
    },
    "VSNAP_PROFILE": {
        "accepts": "a directory, made if missing",
        "default": "none: nothing is timed, wrapped or written",
    },
    "VSNAP_VLLM_DISABLE": {
        "accepts": "1 (the plugin does nothing) or 0",
        "default": "0",
    },
    "VSNAP_RAM_TIER": {
        "accepts": "the directory of a RAM tier (on tmpfs) made by `python3 -m vsnap_vllm.ram_tier init <dir> --budget <bytes>`",
        "default": "none: the vsnap sleep-mode backend sleeps and wakes as vLLM's cumem backend, said in one log line",
    },
    "VSNAP_VLLM_HOST_MEMORY": {
        "accepts": "1 (host memory in place of GPU memory: the CPU test engine only) or 0",
        "default": "0",
    },
}


class SettingError(ValueError):
    """A VSNAP_* variable holds a value it does not accept."""

    code = "E_CONFIG"

    def __init__(self, name, value):
        super().__init__(f"${name}={value!r} is not valid: it accepts {SETTINGS[name]['accepts']}. Fix it, or unset it for the default.")
        self.variable = name


def _raw(name, env):
    value = (os.environ if env is None else env).get(name)
    return value if value else None


def _switch(name, env):
    value = _raw(name, env)
    if value is None or value == "0":
        return False
    if value == "1":
        return True
    raise SettingError(name, value)


def token(env=None):
    """VSNAP_TOKEN: the bearer token of the /vsnap/v1 routes, or None (the routes are off)."""
    return _raw("VSNAP_TOKEN", env)


def profile_dir(env=None):
    """VSNAP_PROFILE: the directory step timings are appended to (profile.py), or None."""
    return _raw("VSNAP_PROFILE", env)


def disabled(env=None):
    """VSNAP_VLLM_DISABLE=1: the plugin registers nothing."""
    return _switch("VSNAP_VLLM_DISABLE", env)


def host_memory(env=None):
    """VSNAP_VLLM_HOST_MEMORY=1: the host-memory driver of the CPU test engine in place of CUDA."""
    return _switch("VSNAP_VLLM_HOST_MEMORY", env)


def ram_tier_dir(env=None):
    """VSNAP_RAM_TIER: the RAM tier the `vsnap` sleep-mode backend keeps sleeping weights in
    (shared by every engine of the host started with the same directory), or None."""
    return _raw("VSNAP_RAM_TIER", env)
