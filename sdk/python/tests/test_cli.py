"""Unit tests of `python -m vertal2kubo` against a local stub of the API."""

import io
import json
import os
import subprocess
import sys
import tempfile
import unittest
from unittest import mock

from vertal2kubo.__main__ import main

from .stub import StubAPI

HERE = os.path.dirname(os.path.abspath(__file__))
PACKAGE_ROOT = os.path.dirname(HERE)


class CLITest(unittest.TestCase):
    def setUp(self):
        self.api = StubAPI().__enter__()
        self.addCleanup(self.api.__exit__)
        patcher = mock.patch.dict(os.environ, {"KUBO_API_URL": self.api.url + "/api", "KUBO_API_KEY": "kubo_sk_test"})
        patcher.start()
        self.addCleanup(patcher.stop)

    def cli(self, *argv, stdin=""):
        out, err = io.StringIO(), io.StringIO()
        code = main(list(argv), stdin=io.StringIO(stdin), stdout=out, stderr=err)
        return code, out.getvalue(), err.getvalue()

    def bodies(self):
        return [json.loads(r[3]) for r in self.api.requests if r[:2] == ("POST", "/v1/executions")]

    def test_run(self):
        with tempfile.NamedTemporaryFile("w", suffix=".sh", delete=False) as f:
            f.write("echo from-file\n")
        self.addCleanup(os.unlink, f.name)
        cases = [
            ("code argument", ["run", "print(6*7)"], "", (0, "42\n", ""), {"language": "python", "code": "print(6*7)"}),
            ("documented flags after code", ["run", "console.log(6*7)", "--language", "javascript", "--timeout", "5"], "",
             (0, "console.log(6*7)", ""), {"language": "javascript", "code": "console.log(6*7)", "timeout_s": 5}),
            ("failure mirrors exit code", ["run", "raise SystemExit(3)"], "",
             (3, "", "Traceback (most recent call last):\nValueError\n"), {"language": "python", "code": "raise SystemExit(3)"}),
            ("timeout", ["run", "-l", "python", "while True: pass"], "",
             (137, "", "vertal2kubo run: timed out (2s, exe_3)\n"), {"language": "python", "code": "while True: pass"}),
            ("file infers language", ["run", f.name], "", (0, "echo from-file\n", ""), {"language": "bash", "code": "echo from-file\n"}),
            ("code from stdin", ["run", "-", "--language", "bash"], "echo piped", (0, "echo piped", ""), {"language": "bash", "code": "echo piped"}),
            ("stdin from stdin", ["run", "input()", "--stdin", "-"], "line\n", (0, "input()", ""),
             {"language": "python", "code": "input()", "stdin": "line\n"}),
            ("api error", ["run", "x", "--timeout", "999"], "",
             (125, "", "vertal2kubo run: invalid_timeout: timeout_s must be between 1 and 60 seconds on plan pro (HTTP 400, request id req_bad)\n"),
             {"language": "python", "code": "x", "timeout_s": 999}),
            ("quota", ["run", "quota"], "",
             (125, "", "vertal2kubo run: quota_exceeded: daily quota of 100 executions reached (HTTP 429, request id req_q, retry after 3600s)\n"),
             {"language": "python", "code": "quota"}),
        ]
        for name, argv, stdin, want, want_body in cases:
            with self.subTest(name):
                self.api.requests.clear()
                self.assertEqual(self.cli(*argv, stdin=stdin), want)
                self.assertEqual(self.bodies(), [want_body])

    def test_run_json(self):
        code, out, err = self.cli("run", "print(6*7)", "--json")
        self.assertEqual((code, err), (0, ""))
        self.assertEqual(json.loads(out)["request_id"], "req_be05ea1492f949f8a0617a4f3cd738cc")

    def test_flags_override_environment(self):
        code, out, _ = self.cli("run", "print(6*7)", "--url", self.api.url, "--key", "kubo_sk_flag")
        self.assertEqual(code, 125)
        self.assertEqual(self.api.requests[-1][2]["Authorization"], "Bearer kubo_sk_flag")

    def test_usage(self):
        code, out, err = self.cli("usage")
        self.assertEqual((code, err), (0, ""))
        self.assertEqual(out, "tenant  acme\nplan    free\ntoday   3 executions, 2.635 sandbox seconds (UTC day)\nlimits\n"
                              "  executions_per_day   100\n  max_timeout_s        10\n  memory_mb            256\n"
                              "  requests_per_minute  20\n")
        code, out, _ = self.cli("usage", "--json")
        self.assertEqual(json.loads(out)["tenant"], "acme")

    def test_no_key(self):
        with mock.patch.dict(os.environ, {}, clear=True):
            self.assertEqual(self.cli("run", "print(1)"), (2, "", "vertal2kubo run: no API key: pass api_key or set KUBO_API_KEY\n"))

    def test_operator_command_without_binary(self):
        env = dict(os.environ, PATH="/nonexistent", PYTHONPATH=PACKAGE_ROOT)
        p = subprocess.run([sys.executable, "-m", "vertal2kubo", "create-key", "acme", "--plan", "pro"],
                           capture_output=True, text=True, env=env, timeout=60)
        self.assertEqual(p.returncode, 127)
        self.assertIn("'vertal'", p.stderr)
        self.assertIn("not on PATH", p.stderr)

    def test_operator_command_execs_binary(self):
        with tempfile.TemporaryDirectory() as d:
            fake = os.path.join(d, "vertal")
            with open(fake, "w") as f:
                f.write('#!/bin/sh\necho "vertal got: $*"\nexit 7\n')
            os.chmod(fake, 0o755)
            env = dict(os.environ, PATH=d + os.pathsep + os.environ.get("PATH", ""), PYTHONPATH=PACKAGE_ROOT)
            p = subprocess.run([sys.executable, "-m", "vertal2kubo", "serve", "--runtime", "runsc"],
                               capture_output=True, text=True, env=env, timeout=60)
            self.assertEqual((p.returncode, p.stdout), (7, "vertal got: serve --runtime runsc\n"))


if __name__ == "__main__":
    unittest.main()
