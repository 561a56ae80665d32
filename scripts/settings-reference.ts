// The environment variables section of docs/configuration.md: the SDK's and the CLI's from
// src/settings.ts (where they are read), the addon's and the vLLM plugin's from the tables below
// (engines/vllm/tests/test_settings.py checks the plugin's against vsnap_vllm/settings.py).
import { SETTINGS, type SettingInfo } from '../src/settings.js';

/** The plugin's variables, set in the engine's environment (vsnap_vllm/settings.py reads them). */
export const PLUGIN_SETTINGS: Record<string, Omit<SettingInfo, 'readBy'>> = {
  VSNAP_TOKEN: {
    accepts: 'the bearer token every /vsnap/v1 request must carry',
    default: 'none: the /vsnap/v1 routes answer 503 and do nothing',
    meaning: "The token of the engine's vsnap routes (compared in constant time); give the same to the SDK (`EngineClient`'s `token`) or the CLI.",
  },
  VSNAP_PROFILE: {
    accepts: 'a directory, made if missing',
    default: 'none: nothing is timed, wrapped or written',
    meaning:
      "Step timings, to see where a slow sleep, wake or export spends its time: each step of the plugin's routes, worker methods and hooks and of vLLM's sleep-mode allocator appends one JSON line to `<dir>/<pid>.jsonl`. Read once, when the plugin loads.",
  },
  VSNAP_VLLM_DISABLE: {
    accepts: '1 (the plugin does nothing) or 0',
    default: '0',
    meaning: 'Turns the plugin off in a vLLM that has it installed.',
  },
  VSNAP_RAM_TIER: {
    accepts: 'the directory of a RAM tier (on tmpfs) made by `python3 -m vsnap_vllm.ram_tier init <dir> --budget <bytes>`',
    default: "none: the vsnap sleep-mode backend sleeps and wakes as vLLM's cumem backend, said in one log line",
    meaning:
      "Where the `vsnap` sleep-mode backend (`--sleep-mode-backend vsnap`) keeps sleeping engines' weights: every engine of the host started with the same directory shares the tier and its budget, and identical weights are held once.",
  },
  VSNAP_VLLM_HOST_MEMORY: {
    accepts: '1 (host memory in place of GPU memory: the CPU test engine only) or 0',
    default: '0',
    meaning: "For vsnap's own CPU tests (the reference engine): the plugin exports host memory. Never set it with vLLM.",
  },
};

/** The addon's own: read by its C++ when it loads the CUDA driver (native/cuda/driver.cc), before any JavaScript could check it. */
export const ADDON_SETTINGS: Record<string, Omit<SettingInfo, 'readBy'>> = {
  VSNAP_LIBCUDA: {
    accepts: 'a file name or path dlopen accepts',
    default: 'libcuda.so.1',
    meaning: "The CUDA driver library to load; when it cannot load, `vsnap doctor` and `E_CUDA_UNAVAILABLE` say which library was tried and why.",
  },
};

const cell = (text: string): string => text.replaceAll('|', '\\|');

/** The section, as Markdown lines. */
export function settingsReference(): string[] {
  const rows = [
    ...Object.entries(SETTINGS).map(([name, s]) => ({ name, ...s })),
    ...Object.entries(ADDON_SETTINGS).map(([name, s]) => ({ name, readBy: 'SDK (the addon)', ...s })),
    ...Object.entries(PLUGIN_SETTINGS).map(([name, s]) => ({ name, readBy: 'plugin', ...s })),
  ];
  return [
    '## Environment variables',
    '',
    'Read by the SDK (any program using vsnap), the `vsnap` command (CLI), `vsnap serve`, and the vLLM plugin (set in',
    "the engine's environment). Each is read when it is used; an empty value counts as unset. A value a variable does",
    'not accept is an `E_CONFIG` error naming the variable and what it accepts. The SDK and the CLI read them in one',
    'module (`src/settings.ts`; `npm test` fails on a read anywhere else in `src/`), the addon its one variable in',
    '`native/cuda/driver.cc`, the plugin in `vsnap_vllm/settings.py`.',
    '',
    '| variable | read by | accepts | default | meaning |',
    '| --- | --- | --- | --- | --- |',
    ...rows.map((r) => `| \`${r.name}\` | ${r.readBy} | ${cell(r.accepts)} | ${cell(r.default)} | ${cell(r.meaning)} |`),
    '',
  ];
}
