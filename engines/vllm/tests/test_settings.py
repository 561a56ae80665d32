"""vsnap_vllm/settings.py: every VSNAP_* variable of the plugin is read there (and nowhere else in
the plugin), when used, and a value it does not accept is an E_CONFIG error naming it;
docs/configuration.md lists each with its default."""

import ast
import os
import subprocess
import sys
import unittest

from tests import support
from vsnap_vllm import api, settings

PACKAGE = os.path.join(support.PLUGIN, "vsnap_vllm")


def environment_reads(source):
    """The VSNAP_* names `source` reads from the environment: os.environ.get / [] / pop /
    setdefault, os.getenv, `in os.environ`, with (line, name) for each."""
    found = []

    def is_environ(node):
        return any(isinstance(n, (ast.Attribute, ast.Name)) and getattr(n, "attr", getattr(n, "id", None)) == "environ" for n in ast.walk(node))

    def vsnap(node):
        return isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value.startswith("VSNAP_")

    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Call) and node.args and vsnap(node.args[0]):
            f = node.func
            if (isinstance(f, ast.Attribute) and f.attr in ("get", "pop", "setdefault") and is_environ(f.value)) or getattr(f, "attr", getattr(f, "id", None)) == "getenv":
                found.append((node.lineno, node.args[0].value))
        elif isinstance(node, ast.Subscript) and vsnap(node.slice) and is_environ(node.value):
            found.append((node.lineno, node.slice.value))
        elif isinstance(node, ast.Compare) and vsnap(node.left) and any(isinstance(op, (ast.In, ast.NotIn)) for op in node.ops) and any(is_environ(c) for c in node.comparators):
            found.append((node.lineno, node.left.value))
    return found


class ReadInOneModule(unittest.TestCase):
    def test_the_scan_finds_each_form(self):
        text = "\n".join([
            "import os",
            "from os import environ, getenv",
            "a = os.environ.get('VSNAP_A')",
            "b = os.environ['VSNAP_B']",
            "c = getenv('VSNAP_C', '')",
            "d = 'VSNAP_D' in os.environ",
            "e = environ.pop('VSNAP_E', None)",
            "f = os.environ.get('VLLM_PLUGINS')",  # vLLM's own: not vsnap's
            "g = {'VSNAP_TOKEN': 'x'}",  # a child's environment written: not a read
        ])
        self.assertEqual(environment_reads(text), [(3, "VSNAP_A"), (4, "VSNAP_B"), (5, "VSNAP_C"), (6, "VSNAP_D"), (7, "VSNAP_E")])

    def test_no_module_but_settings_reads_a_vsnap_variable(self):
        reads = {}
        for name in sorted(os.listdir(PACKAGE)):
            if name.endswith(".py") and name != "settings.py":
                with open(os.path.join(PACKAGE, name)) as f:
                    found = environment_reads(f.read())
                if found:
                    reads[name] = found
        self.assertEqual(reads, {})


class Values(unittest.TestCase):
    def test_unset_and_empty_are_the_defaults(self):
        for env in ({}, {name: "" for name in settings.SETTINGS}):
            self.assertIsNone(settings.token(env))
            self.assertIsNone(settings.profile_dir(env))
            self.assertFalse(settings.disabled(env))
            self.assertFalse(settings.host_memory(env))

    def test_set_values(self):
        self.assertEqual(settings.token({"VSNAP_TOKEN": "s3cret"}), "s3cret")
        self.assertEqual(settings.profile_dir({"VSNAP_PROFILE": "/tmp/p"}), "/tmp/p")
        self.assertTrue(settings.disabled({"VSNAP_VLLM_DISABLE": "1"}))
        self.assertFalse(settings.disabled({"VSNAP_VLLM_DISABLE": "0"}))
        self.assertTrue(settings.host_memory({"VSNAP_VLLM_HOST_MEMORY": "1"}))

    def test_a_value_a_switch_does_not_accept_is_E_CONFIG_naming_it(self):
        for value in ("true", "yes", " 1", "2"):
            with self.assertRaises(settings.SettingError) as caught:
                settings.disabled({"VSNAP_VLLM_DISABLE": value})
            self.assertEqual(caught.exception.code, "E_CONFIG")
            self.assertEqual(caught.exception.variable, "VSNAP_VLLM_DISABLE")
            self.assertIn("$VSNAP_VLLM_DISABLE=", str(caught.exception))
            self.assertIn("it accepts 1 (the plugin does nothing) or 0", str(caught.exception))

    def test_a_bad_switch_turns_the_plugin_off_and_never_stops_vllm_starting(self):
        # vLLM calls register() in every process it starts: an exception there would end vLLM
        root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
        env = {k: v for k, v in os.environ.items() if not k.startswith("VSNAP_")}
        env.update(VSNAP_VLLM_DISABLE="true", PYTHONPATH=root)
        code = "import sys, vsnap_vllm; vsnap_vllm.register(); print('registered', 'vsnap_vllm.adapter' in sys.modules)"
        run = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
        self.assertEqual(run.returncode, 0, run.stderr)
        self.assertEqual(run.stdout.strip(), "registered False")
        self.assertIn("vsnap plugin disabled: $VSNAP_VLLM_DISABLE='true' is not valid", run.stderr)

    def test_read_when_used(self):
        saved = os.environ.pop("VSNAP_TOKEN", None)
        try:
            self.assertIsNone(settings.token())
            os.environ["VSNAP_TOKEN"] = "later"
            self.assertEqual(settings.token(), "later")

            class Request:
                headers = {"authorization": "Bearer later"}

            api._authorize(Request())  # the routes see a token set after the plugin was imported
        finally:
            os.environ.pop("VSNAP_TOKEN", None)
            if saved is not None:
                os.environ["VSNAP_TOKEN"] = saved


class Documented(unittest.TestCase):
    def test_docs_configuration_lists_every_setting_with_its_default(self):
        with open(os.path.join(support.ROOT, "docs", "configuration.md")) as f:
            rows = [line for line in f.read().splitlines() if line.startswith("| `VSNAP_")]
        for name, info in settings.SETTINGS.items():
            row = next((r for r in rows if r.startswith(f"| `{name}`") and "plugin" in r), None)
            self.assertIsNotNone(row, f"{name} has a row of the plugin in docs/configuration.md")
            self.assertIn(info["default"], row)
            self.assertIn(info["accepts"], row)


if __name__ == "__main__":
    unittest.main()
