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

from .stub import FETCH_EXECUTION, MADE_FILES, OK_EXECUTION, StubAPI, sse_event, sse_of

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

    def tempdir(self):
        d = tempfile.TemporaryDirectory()
        self.addCleanup(d.cleanup)
        return d.name

    def accepts(self):
        return [r[2].get("Accept") for r in self.api.requests if r[:2] == ("POST", "/v1/executions")]

    def test_streams_by_default(self):
        """Output is written as each event arrives: the test holds the
        stream after the first chunk and looks at what is already out."""
        import threading
        seen = threading.Event()
        release = threading.Event()
        out = io.StringIO()

        def hold():
            seen.set()
            release.wait(10)
        ex = dict(OK_EXECUTION, stdout="one\ntwo\n", stderr="warn\n")
        self.api.push("POST /v1/executions", (200, {}, [
            sse_event("0-0", "started", {"id": ex["id"], "language": "python"}),
            sse_event("4-0", "stdout", {"text": "one\n"}), hold,
            sse_event("8-0", "stdout", {"text": "two\n"}), sse_event("8-5", "stderr", {"text": "warn\n"}),
            sse_event("end", "result", ex)]))
        err = io.StringIO()
        done = []
        t = threading.Thread(target=lambda: done.append(main(["run", "x"], stdin=io.StringIO(), stdout=out, stderr=err)))
        t.start()
        self.assertTrue(seen.wait(10))
        # The first chunk is out before the run has finished.
        for _ in range(100):
            if out.getvalue():
                break
            threading.Event().wait(0.02)
        self.assertEqual(out.getvalue(), "one\n")
        release.set()
        t.join(10)
        self.assertEqual((done, out.getvalue(), err.getvalue()), ([0], "one\ntwo\n", "warn\n"))
        self.assertEqual(self.accepts(), ["text/event-stream"])

    def test_no_stream(self):
        self.assertEqual(self.cli("run", "print(6*7)", "--no-stream"), (0, "42\n", ""))
        self.assertEqual(self.accepts(), ["application/json"])

    def test_stream_error_event(self):
        self.api.push("POST /v1/executions", (200, {}, [
            sse_event("0-0", "started", {"id": "exe_e", "language": "python"}),
            sse_event("end", "error", {"error": {"code": "internal", "message": "the sandbox driver failed"}, "request_id": "req_e"})]))
        self.assertEqual(self.cli("run", "x"), (125, "", "vertal2kubo run: internal: the sandbox driver failed (request id req_e)\n"))

    def test_run_flags(self):
        d = self.tempdir()
        data = os.path.join(d, "data.csv")
        with open(data, "wb") as f:
            f.write(b"a,b\n")
        logo = os.path.join(d, "logo.bin")
        with open(logo, "wb") as f:
            f.write(b"\x89PNG\x00")
        colon = os.path.join(d, "odd:name.txt")
        with open(colon, "w") as f:
            f.write("colon")
        with mock.patch.dict(os.environ, {"FROM_HERE": "yes"}):
            code, out, err = self.cli("run", "echo", "-l", "bash", "--no-stream", "--file", data, "--file", logo + ":in/logo.png",
                                      "--file", colon, "--env", "A=1", "--env", "B=x=y", "--env", "FROM_HERE", "--arg=--n",
                                      "--return", "*.png", "--return", "out/**", "--out", os.path.join(d, "res"), "--", "3", "--four")
        self.assertEqual(code, 0, err)
        self.assertEqual(self.bodies(), [{
            "language": "bash", "code": "echo",
            "files": [{"path": "data.csv", "content": "a,b\n", "encoding": "utf8"},
                      {"path": "in/logo.png", "content": "iVBORwA=", "encoding": "base64"},
                      {"path": "odd:name.txt", "content": "colon", "encoding": "utf8"}],
            "env": {"A": "1", "B": "x=y", "FROM_HERE": "yes"}, "args": ["--n", "3", "--four"],
            "return_files": ["*.png", "out/**"],
        }])

    def test_network_flags(self):
        for flags, want in [([], None), (["--allow", "pypi.org", "--allow", "*.pythonhosted.org"], {"allow": ["pypi.org", "*.pythonhosted.org"]}),
                            (["--no-network"], {"allow": []}), (["--async", "--allow", "pypi.org"], {"allow": ["pypi.org"]})]:
            with self.subTest(flags=flags):
                self.api.requests.clear()
                self.assertEqual(self.cli("run", "print(6*7)", *flags)[0], 0)
                self.assertEqual(self.bodies()[-1].get("network"), want)
        # Nothing new is printed; --json shows the network as the API gave it.
        self.assertEqual(self.cli("run", "fetch", "--allow", "pypi.org"), (1, "200\n", "URLError\n"))
        code, out, err = self.cli("run", "fetch", "--json")
        self.assertEqual((code, err), (1, ""))
        self.assertEqual(json.loads(out)["network"], FETCH_EXECUTION["network"])

    def test_code_after_double_dash(self):
        self.assertEqual(self.cli("run", "-l", "bash", "--", "echo $1", "world")[0], 0)
        self.assertEqual(self.bodies(), [{"language": "bash", "code": "echo $1", "args": ["world"]}])

    def test_bad_flags(self):
        d = self.tempdir()
        cases = [
            ("missing file", ["--file", os.path.join(d, "nope.txt")], "vertal2kubo run: --file " + os.path.join(d, "nope.txt")
             + ": No such file or directory: " + os.path.join(d, "nope.txt") + "\n"),
            ("directory as file", ["--file", d], f"vertal2kubo run: --file {d}: {d} is not a regular file\n"),
            ("empty local", ["--file", ":x"], "vertal2kubo run: --file :x: want LOCAL or LOCAL:PATH\n"),
            ("env not set here", ["--env", "SURELY_NOT_SET_1234"],
             "vertal2kubo run: --env SURELY_NOT_SET_1234: SURELY_NOT_SET_1234 is not set here; give it as SURELY_NOT_SET_1234=VALUE\n"),
            ("env without name", ["--env", "=v"], "vertal2kubo run: --env =v: want NAME=VALUE\n"),
            ("allow and no network", ["--allow", "pypi.org", "--no-network"],
             "vertal2kubo run: --allow and --no-network cannot go together\n"),
            ("empty allow", ["--allow="],
             "vertal2kubo run: --allow: want a host name, *.suffix or an address range (--no-network for none)\n"),
        ]
        for name, flags, want in cases:
            with self.subTest(name):
                self.api.requests.clear()
                self.assertEqual(self.cli("run", "print(1)", *flags), (2, "", want))
                self.assertEqual(self.api.requests, [])
        self.assertEqual(self.cli("run", "--language", "bash"),
                         (2, "", "vertal2kubo run: want exactly one CODE, FILE or -; see python -m vertal2kubo run -h\n"))

    def test_returned_files_written(self):
        d = self.tempdir()
        res = os.path.join(d, "res")
        for stream in ([], ["--no-stream"]):
            with self.subTest(stream=stream):
                code, out, err = self.cli("run", "make()", *stream, "--file", __file__ + ":in/copy.py",
                                          "--return", "*.png", "--return", "in/**", "--out", res)
                self.assertEqual(code, 0, err)
                with open(os.path.join(res, "chart.png"), "rb") as f:
                    self.assertEqual(f.read(), MADE_FILES["chart.png"])
                with open(os.path.join(res, "in", "copy.py"), "rb") as f, open(__file__, "rb") as g:
                    self.assertEqual(f.read(), g.read())
                self.assertEqual(err, f"vertal2kubo run: wrote {res}/chart.png ({len(MADE_FILES['chart.png'])} bytes)\n"
                                      f"vertal2kubo run: wrote {res}/in/copy.py ({os.path.getsize(__file__)} bytes)\n")
                self.assertEqual(sorted(os.listdir(res)), ["chart.png", "in"], "no temporary files are left")

    def test_json_keeps_base64(self):
        d = self.tempdir()
        code, out, err = self.cli("run", "make()", "--json", "--return", "*.bin", "--out", d)
        self.assertEqual(code, 0, err)
        self.assertEqual(json.loads(out)["files"], [{"path": "notes.bin", "size": 4, "encoding": "base64", "content": "/wD+AQ=="}])
        with open(os.path.join(d, "notes.bin"), "rb") as f:
            self.assertEqual(f.read(), MADE_FILES["notes.bin"])

    def test_hostile_returned_files(self):
        """Paths come from the server: nothing may land outside --out, and
        no symlink under it is followed, whether it is a directory on the
        way or the file's own name."""
        d = self.tempdir()
        out_dir, outside = os.path.join(d, "out"), os.path.join(d, "outside")
        os.makedirs(out_dir)
        os.makedirs(outside)
        with open(os.path.join(outside, "victim.txt"), "w") as f:
            f.write("keep")
        os.symlink(outside, os.path.join(out_dir, "link"))
        os.symlink(os.path.join(outside, "victim.txt"), os.path.join(out_dir, "victim.txt"))
        os.makedirs(os.path.join(out_dir, "adir"))
        with open(os.path.join(out_dir, "plain.txt"), "w") as fh:
            fh.write("plain")

        def f(path, content=b"pwned"):
            import base64
            return {"path": path, "size": len(content), "encoding": "base64", "content": base64.b64encode(content).decode()}
        ex = dict(OK_EXECUTION, files_truncated=True, files=[
            f("../escape.txt"), f("/etc/evil"), f("a/./b"), f("a//b"), f("back\\slash"), f("link/x.txt"),
            f("victim.txt"), f("adir"), f("plain.txt/x"), f("ok/fine.txt", b"fine"), f("adir/in.txt", b"in")])
        # at: relative to open directories (Linux, macOS); else by path (Windows).
        for stream, at in ((True, True), (False, True), (True, False)):
            with self.subTest(stream=stream, at=at), mock.patch("vertal2kubo._files._AT", at):
                self.api.push("POST /v1/executions", (200, {}, sse_of(ex) if stream else ex))
                code, _, err = self.cli("run", "x", *([] if stream else ["--no-stream"]), "--return", "**", "--out", out_dir)
                self.assertEqual(code, 1, "a run that succeeded but lost files is a failure")
                self.assertEqual(err.splitlines(), [
                    "vertal2kubo run: returned files truncated at the plan's limit (count or size)",
                    'vertal2kubo run: not writing returned file "../escape.txt": has an empty, . or .. component',
                    "vertal2kubo run: not writing returned file \"/etc/evil\": not a relative '/'-separated path",
                    'vertal2kubo run: not writing returned file "a/./b": has an empty, . or .. component',
                    'vertal2kubo run: not writing returned file "a//b": has an empty, . or .. component',
                    "vertal2kubo run: not writing returned file \"back\\\\slash\": not a relative '/'-separated path",
                    'vertal2kubo run: not writing returned file "link/x.txt": link is a symlink',
                    'vertal2kubo run: not writing returned file "victim.txt": victim.txt exists and is not a regular file',
                    'vertal2kubo run: not writing returned file "adir": adir exists and is not a regular file',
                    'vertal2kubo run: not writing returned file "plain.txt/x": plain.txt is not a directory',
                    f"vertal2kubo run: wrote {out_dir}/ok/fine.txt (4 bytes)",
                    f"vertal2kubo run: wrote {out_dir}/adir/in.txt (2 bytes)",
                    "vertal2kubo run: 9 of 11 returned files were not written",
                ])
                self.assertEqual(os.listdir(outside), ["victim.txt"])
                with open(os.path.join(outside, "victim.txt")) as fh:
                    self.assertEqual(fh.read(), "keep")
                self.assertTrue(os.path.islink(os.path.join(out_dir, "victim.txt")))
                self.assertFalse(os.path.exists(os.path.join(d, "escape.txt")))
                self.assertEqual(sorted(os.listdir(out_dir)), ["adir", "link", "ok", "plain.txt", "victim.txt"])

    def test_flag_errors_go_to_the_given_stderr(self):
        code, out, err = self.cli("run", "x", "--timeout", "soon")
        self.assertEqual((code, out), (2, ""))
        self.assertIn("--timeout: invalid float value: 'soon'", err)

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


class AsyncCLITest(unittest.TestCase):
    # CLITest's fixture, without running its tests a second time.
    setUp, cli, bodies = CLITest.setUp, CLITest.cli, CLITest.bodies

    def test_run_async(self):
        code, out, err = self.cli("run", "--async", "print(1)", "--webhook", "https://hooks.example.com/v")
        self.assertEqual((code, out, err), (0, "exe_q\n", ""))
        self.assertEqual(self.bodies(), [{"language": "python", "code": "print(1)", "async": True, "webhook_url": "https://hooks.example.com/v"}])
        code, out, err = self.cli("run", "--async", "--json", "print(1)")
        self.assertEqual((code, err), (0, ""))
        self.assertEqual((json.loads(out)["id"], json.loads(out)["status"]), ("exe_q", "queued"))
        code, out, err = self.cli("run", "print(1)", "--webhook", "https://hooks.example.com/v")
        self.assertEqual((code, out, err), (2, "", "vertal2kubo run: --webhook needs --async: a run waited for has no webhook\n"))

    def test_wait(self):
        done = {"id": "exe_w", "status": "failed", "stdout": "partial\n", "stderr": "Traceback\n", "exit_code": 3, "duration_ms": 20,
                "truncated": False, "usage": {"sandbox_seconds": 0.02}, "request_id": "req_w", "reason": None, "webhook": None,
                "files": [{"path": "out.txt", "size": 3, "encoding": "base64", "content": "b2sK"}], "files_truncated": False}
        crashed = dict(done, id="exe_p", status="error", stdout="", stderr="", exit_code=0, files=[], reason="the node running it stopped")
        out_dir = tempfile.mkdtemp()
        self.addCleanup(__import__("shutil").rmtree, out_dir)
        self.api.push("GET /v1/executions/{id}", (200, {}, sse_of(done)))
        code, out, err = self.cli("wait", "exe_w", "--out", out_dir)
        self.assertEqual((code, out, err), (3, "partial\n", f"Traceback\nvertal2kubo wait: wrote {os.path.join(out_dir, 'out.txt')} (3 bytes)\n"))
        with open(os.path.join(out_dir, "out.txt"), "rb") as f:
            self.assertEqual(f.read(), b"ok\n")
        self.api.push("GET /v1/executions/{id}", (200, {}, sse_of(done)))
        code, out, err = self.cli("wait", "--json", "--out", out_dir, "exe_w")
        self.assertEqual((code, json.loads(out)["files"][0]["content"]), (3, "b2sK"))
        self.api.push("GET /v1/executions/{id}", (404, {}, {"error": {"code": "not_found", "message": "no"}, "request_id": "r"}), (200, {}, crashed))
        code, out, err = self.cli("wait", "exe_p")
        self.assertEqual((code, out, err), (1, "", "vertal2kubo wait: the execution ended in error: the node running it stopped (exe_p, request req_w)\n"))
        not_found = (404, {}, {"error": {"code": "not_found", "message": "no such execution"}, "request_id": "req_n"})
        self.api.push("GET /v1/executions/{id}", not_found, not_found)
        code, out, err = self.cli("wait", "exe_nope")
        self.assertEqual((code, err), (125, "vertal2kubo wait: not_found: no such execution (HTTP 404, request id req_n)\n"))
