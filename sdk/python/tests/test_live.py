"""Tests against a running Vertal Run server.

Set VERTAL_TEST_URL (e.g. http://127.0.0.1:8080/api) and VERTAL_TEST_KEY (a
key of a free or pro tenant used by nothing else). The key is rotated by
these tests, so it is revoked when they finish; the last key is printed.
"""

import contextlib
import io
import json
import os
import re
import subprocess
import sys
import unittest
import uuid

from vertal2kubo import _mcp_sandboxes
from vertal2kubo.client import KuboClient, KuboError

URL = os.environ.get("VERTAL_TEST_URL", "")
KEY = os.environ.get("VERTAL_TEST_KEY", "")
HERE = os.path.dirname(os.path.abspath(__file__))
PACKAGE_ROOT = os.path.dirname(HERE)

# The SDK example of the documentation, as written; only the URL and key
# literals are replaced before it runs.
DOCS_SNIPPET = '''
from vertal2kubo.client import KuboClient, KuboError

client = KuboClient("https://vertalrun.com/api", "kubo_sk_...")   # or KUBO_API_URL / KUBO_API_KEY env vars

result = client.run("print(sum(range(10)))", language="python", timeout_s=10)
print(result["status"], result["stdout"])                   # succeeded 45

print(client.get(result["id"])["created_at"])
print(client.usage()["today"])

client.run("print(1)", idempotency_key="job-42")             # retry-safe: same key, same result
client.rotate_key()                                         # new key; the client switches to it

try:
    client.run("x", timeout_s=999)
except KuboError as e:
    print(e.status, e.code, e.request_id)                   # 400 invalid_timeout req_...
'''


class Key:
    """The suite's current key: tests that rotate it update it here."""
    value = KEY


def env_for(key):
    return dict(os.environ, KUBO_API_URL=URL, KUBO_API_KEY=key,
                PYTHONPATH=PACKAGE_ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))


@unittest.skipUnless(URL and KEY, "set VERTAL_TEST_URL and VERTAL_TEST_KEY to test against a live server")
class LiveTest(unittest.TestCase):
    """Test names are ordered: the ones that rotate the key run last."""

    def client(self, url=URL):
        return KuboClient(url, Key.value)

    def test_1_run_languages(self):
        cases = [
            ("python", "print(6 * 7)", "42\n"),
            ("javascript", "console.log(6*7)", "42\n"),
            ("bash", "echo $((6*7))", "42\n"),
        ]
        c = self.client()
        for language, code, want in cases:
            with self.subTest(language):
                r = c.run(code, language=language, timeout_s=10)
                self.assertEqual((r["status"], r["stdout"], r["stderr"], r["exit_code"], r["truncated"]),
                                 ("succeeded", want, "", 0, False))
                self.assertRegex(r["id"], r"^exe_[0-9a-f]{32}$")
                self.assertRegex(r["request_id"], r"^req_[0-9a-f]{32}$")
                self.assertGreater(r["usage"]["sandbox_seconds"], 0)

    def test_1_failure_stdin_and_get(self):
        c = self.client()
        r = c.run("import sys\nprint(sys.stdin.read().upper())\nsys.exit(3)", stdin="abc")
        self.assertEqual((r["status"], r["exit_code"], r["stdout"]), ("failed", 3, "ABC\n"))
        stored = c.get(r["id"])
        self.assertEqual((stored["id"], stored["language"], stored["stdout"]), (r["id"], "python", "ABC\n"))
        self.assertIsInstance(stored["created_at"], int)

    def test_1_base_url_with_and_without_api(self):
        other = URL[: -len("/api")] if URL.rstrip("/").endswith("/api") else URL.rstrip("/") + "/api"
        for url in (URL, other):
            with self.subTest(url):
                self.assertEqual(self.client(url).run("print(6 * 7)")["stdout"], "42\n")

    def test_1_idempotency(self):
        c = self.client()
        key = "py-live-" + uuid.uuid4().hex
        before = c.usage()["today"]["executions"]
        first = c.run("import random; print(random.random())", idempotency_key=key)
        again = c.run("import random; print(random.random())", idempotency_key=key)
        self.assertEqual((again["id"], again["stdout"], again.get("idempotent_replay")), (first["id"], first["stdout"], True))
        self.assertEqual(c.usage()["today"]["executions"], before + 1, "a replay uses no quota")
        with self.assertRaises(KuboError) as cm:
            c.run("print('different')", idempotency_key=key)
        self.assertEqual((cm.exception.status, cm.exception.code), (409, "idempotency_conflict"))

    def test_1_errors(self):
        c = self.client()
        with self.assertRaises(KuboError) as cm:
            c.run("x", timeout_s=999)
        e = cm.exception
        self.assertEqual((e.status, e.code), (400, "invalid_timeout"))
        self.assertRegex(e.request_id, r"^req_[0-9a-f]{32}$")
        with self.assertRaises(KuboError) as cm:
            c.get("exe_" + "0" * 32)
        self.assertEqual((cm.exception.status, cm.exception.code), (404, "not_found"))
        with self.assertRaises(KuboError) as cm:
            KuboClient(URL, "kubo_sk_" + "x" * 43).usage()
        self.assertEqual((cm.exception.status, cm.exception.code), (401, "unauthorized"))

    def test_1_usage(self):
        u = self.client().usage()
        self.assertEqual(set(u) >= {"tenant", "plan", "today", "limits"}, True, u)
        self.assertEqual(set(u["limits"]) >= {"executions_per_day", "requests_per_minute", "max_timeout_s"}, True, u)

    def test_1_files_env_args_and_returned_files(self):
        # A CSV in, a PNG (written byte by byte by plain Python) out.
        code = (
            "import os, sys, struct, zlib\n"
            "rows = open('in/data.csv').read().split()\n"
            "print(os.environ['GREETING'], sys.argv[1:], len(rows))\n"
            "raw = b'\\x00\\xff\\x00\\x00'\n"
            "def chunk(t, d): return struct.pack('>I', len(d)) + t + d + struct.pack('>I', zlib.crc32(t + d))\n"
            "png = b'\\x89PNG\\r\\n\\x1a\\n' + chunk(b'IHDR', struct.pack('>IIBBBBB', 1, 1, 8, 2, 0, 0, 0))"
            " + chunk(b'IDAT', zlib.compress(raw)) + chunk(b'IEND', b'')\n"
            "os.makedirs('out', exist_ok=True)\n"
            "open('out/dot.png', 'wb').write(png)\n"
            "open('out/copy.bin', 'wb').write(open('blob.bin', 'rb').read())\n"
        )
        blob = bytes(range(256))
        r = self.client().run(code, files={"in/data.csv": "a,b\n1,2\n3,4\n", "blob.bin": blob},
                              env={"GREETING": "hi"}, args=["x", "y z"], return_files=["out/**"])
        self.assertEqual((r["status"], r["stdout"]), ("succeeded", "hi ['x', 'y z'] 3\n"), r)
        self.assertIs(r["files_truncated"], False)
        got = {f["path"]: f for f in r["files"]}
        self.assertEqual(sorted(got), ["out/copy.bin", "out/dot.png"])
        self.assertEqual(got["out/copy.bin"]["content"], blob)
        self.assertEqual(got["out/copy.bin"]["size"], 256)
        self.assertTrue(got["out/dot.png"]["content"].startswith(b"\x89PNG\r\n\x1a\n"))

    def test_1_bad_files_and_env_are_refused(self):
        c = self.client()
        for kwargs, status, fragment in [
            ({"files": {"../x": "a"}}, 400, "files[0].path"),
            ({"files": {"/etc/x": "a"}}, 400, "files[0].path"),
            ({"env": {"PATH": "/tmp"}}, 400, "env"),
            ({"env": {"1BAD": "x"}}, 400, "env"),
            ({"return_files": ["../*"]}, 400, "return_files"),
        ]:
            with self.subTest(kwargs):
                with self.assertRaises(KuboError) as cm:
                    c.run("print(1)", **kwargs)
                self.assertEqual((cm.exception.status, cm.exception.code), (status, "invalid_request"))
                self.assertIn(fragment, cm.exception.message)

    def test_1_stream_and_attach(self):
        c = self.client()
        code = "import sys, time\nprint('marker', flush=True)\ntime.sleep(1)\nprint('err', file=sys.stderr)\nprint('done')"
        events = []
        running_at_marker = None
        for event in c.stream(code, timeout_s=10):
            events.append(event)
            if event["type"] == "stdout" and "marker" in event["text"] and running_at_marker is None:
                running_at_marker = c.get(event["execution_id"])["status"]
        types = [e["type"] for e in events]
        self.assertEqual((types[0], types[-1]), ("started", "result"), types)
        self.assertEqual(running_at_marker, "running", "the marker arrived while the run was going")
        self.assertEqual(events[0]["id"], "0-0")
        result = events[-1]["execution"]
        self.assertEqual((events[-1]["id"], result["status"], result["stdout"], result["stderr"]),
                         ("end", "succeeded", "marker\ndone\n", "err\n"))
        self.assertEqual("".join(e["text"] for e in events if e["type"] == "stdout"), "marker\ndone\n")
        self.assertEqual("".join(e["text"] for e in events if e["type"] == "stderr"), "err\n")
        # Ids are byte offsets: the last output event's id is the sizes.
        self.assertEqual([e["id"] for e in events if e["type"] in ("stdout", "stderr")][-1], "12-4")

        # Attach replays the same output (a replay from the store may chunk
        # it differently); Last-Event-ID resumes after an event.
        exe = events[0]["execution_id"]
        replay = list(c.attach(exe))
        self.assertEqual((replay[0]["type"], replay[0]["id"], replay[-1]["type"], replay[-1]["execution"]["id"]),
                         ("started", "0-0", "result", exe))
        for stream, want in (("stdout", "marker\ndone\n"), ("stderr", "err\n")):
            self.assertEqual("".join(e["text"] for e in replay if e["type"] == stream), want)
        self.assertEqual([e["id"] for e in replay if e["type"] in ("stdout", "stderr")][-1], "12-4")
        first_out = next(e for e in events if e["type"] == "stdout")
        self.assertEqual(first_out["id"], "7-0")
        resumed = list(c.attach(exe, last_event_id=first_out["id"]))
        self.assertEqual("".join(e["text"] for e in resumed if e["type"] == "stdout"), "done\n")
        self.assertEqual("".join(e["text"] for e in resumed if e["type"] == "stderr"), "err\n")
        self.assertEqual(resumed[-1]["type"], "result")
        self.assertEqual(list(c.attach(exe, last_event_id="end")), [])
        with self.assertRaises(KuboError) as cm:
            list(c.attach("exe_" + "0" * 32))
        self.assertEqual(cm.exception.code, "not_found")

    def test_1_stream_refusal_is_raised(self):
        with self.assertRaises(KuboError) as cm:
            list(self.client().stream("x", timeout_s=999))
        self.assertEqual((cm.exception.status, cm.exception.code), (400, "invalid_timeout"))

    def test_3_sandbox_that_stays(self):
        """create -> commands (state, failure, stream, background) ->
        files -> pause -> resume (files kept) -> kill."""
        import time
        c = self.client()
        tag = uuid.uuid4().hex
        sbx = c.create_sandbox(timeout_s=300, metadata={"suite": tag}, files={"seed.txt": "seeded\n"})

        def cleanup():
            try:
                sbx.kill()
            except KuboError:
                pass
        self.addCleanup(cleanup)
        self.assertRegex(sbx.id, r"^sbx_[0-9a-f]+$")
        self.assertEqual(sbx.status, "running")
        self.assertEqual(c.get_sandbox(sbx.id).info["metadata"], {"suite": tag})
        self.assertIn(sbx.id, [s.id for s in c.list_sandboxes(metadata={"suite": tag})["sandboxes"]])

        r = sbx.commands.run("echo remembered > note.txt; pwd; cat seed.txt")
        self.assertEqual((r["status"], r["exit_code"], r["stdout"]), ("succeeded", 0, "/home/user\nseeded\n"), r)
        self.assertEqual(sbx.commands.run("cat note.txt")["stdout"], "remembered\n")
        r = sbx.commands.run("echo oops >&2; exit 3")
        self.assertEqual((r["status"], r["exit_code"], r["stderr"]), ("failed", 3, "oops\n"), r)
        self.assertEqual(sbx.commands.run(argv=["tr", "a-z", "A-Z"], stdin="judge\n")["stdout"], "JUDGE\n")

        events = list(sbx.commands.stream("echo a; sleep 1; echo b >&2; echo c"))
        self.assertEqual(events[-1]["type"], "result", events)
        self.assertEqual("".join(e["text"] for e in events if e["type"] == "stdout"), "a\nc\n")
        self.assertEqual("".join(e["text"] for e in events if e["type"] == "stderr"), "b\n")
        self.assertEqual((events[-1]["result"]["exit_code"], events[-1]["result"]["stdout"]), (0, "a\nc\n"))

        # A background command: stdin in, its events out, until it exits.
        cat = sbx.commands.start(argv=["cat"])
        sbx.commands.send_stdin(cat["pid"], "hello\n", eof=True)
        attached = list(sbx.commands.events(cat["pid"]))
        self.assertEqual("".join(e.get("text", "") for e in attached if e["type"] == "stdout"), "hello\n")
        self.assertEqual((attached[-1]["type"], attached[-1]["exit_code"]), ("exit", 0))
        sleeper = sbx.commands.start("sleep 120")
        self.assertIn((sleeper["pid"], True), [(x["pid"], x["running"]) for x in sbx.commands.list()])
        sbx.commands.signal(sleeper["pid"], "KILL")
        deadline = time.monotonic() + 60
        while any(x["pid"] == sleeper["pid"] and x["running"] for x in sbx.commands.list()):
            self.assertLess(time.monotonic(), deadline, "the killed command still runs")
            time.sleep(0.2)
        with self.assertRaises(KuboError) as cm:
            sbx.commands.signal(sleeper["pid"], "KILL")
        self.assertEqual((cm.exception.status, cm.exception.code), (409, "process_finished"))

        blob = bytes(range(256)) * 800
        info = sbx.files.write("/home/user/d/deep/blob.bin", blob)
        self.assertEqual((info["size"], info["type"]), (len(blob), "file"))
        self.assertEqual(sbx.files.read("/home/user/d/deep/blob.bin"), blob)
        self.assertEqual([(e["name"], e["size"]) for e in sbx.files.list("/home/user/d/deep")], [("blob.bin", len(blob))])
        self.assertEqual(sbx.commands.run("wc -c < d/deep/blob.bin")["stdout"].strip(), str(len(blob)))
        self.assertEqual(sbx.files.mkdir("/home/user/out")["type"], "dir")
        sbx.files.write("/home/user/tmp.txt", "x")
        sbx.files.move("/home/user/tmp.txt", "/home/user/out/moved.txt")
        self.assertEqual(sbx.files.read("/home/user/out/moved.txt"), b"x")
        sbx.files.remove("/home/user/out")
        with self.assertRaises(KuboError) as cm:
            sbx.files.read("/home/user/out/moved.txt")
        self.assertEqual((cm.exception.status, cm.exception.code), (404, "not_found"))
        with self.assertRaises(KuboError) as cm:
            sbx.files.write("/etc/passwd", b"x")
        self.assertEqual(cm.exception.status // 100, 4)

        # Code contexts: cells keep state; a timeout interrupts and keeps it.
        r = sbx.run_code("rows = open('seed.txt').read().splitlines()\nlen(rows)")
        self.assertEqual((r["status"], r["results"][0]["data"]["text/plain"]), ("succeeded", "1"), r)
        r = sbx.run_code("import time\nrows.append('more')\nwhile True: time.sleep(0.1)", timeout_s=2)
        self.assertEqual((r["status"], r["error"]["name"]), ("timed_out", "KeyboardInterrupt"), r)
        self.assertEqual(sbx.run_code("rows")["results"][0]["data"]["text/plain"], "['seeded', 'more']")
        events = list(sbx.stream_code("const n = 6; console.log('js'); n * 7", language="javascript"))
        self.assertEqual([e["type"] for e in events], ["stdout", "result", "end"], events)
        self.assertEqual(events[1]["result"]["data"]["text/plain"], "42")
        self.assertEqual(sorted(x["language"] for x in sbx.contexts.list()), ["javascript", "python"])

        self.assertEqual(sbx.pause().status, "paused")
        self.assertEqual(c.get_sandbox(sbx.id).status, "paused")
        self.assertEqual(sbx.resume().status, "running")
        self.assertEqual(sbx.files.read("/home/user/d/deep/blob.bin"), blob, "files survive pause and resume")
        self.assertEqual(sbx.commands.run("cat note.txt")["stdout"], "remembered\n")
        # RFC 3339 in UTC; to the second, 600 s from now is past the first 300 s.
        before = sbx.info["expires_at"][:19]
        self.assertGreater(sbx.set_timeout(600).info["expires_at"][:19], before)

        killed = sbx.kill()
        self.assertEqual((killed.status, killed.info["reason"]), ("ended", "killed"))
        with self.assertRaises(KuboError) as cm:
            sbx.commands.run("true")
        self.assertEqual((cm.exception.status, cm.exception.code), (409, "sandbox_not_running"))
        self.assertEqual(sbx.refresh().status, "ended")
        with self.assertRaises(KuboError) as cm:
            c.get_sandbox("sbx_" + "0" * 32)
        self.assertEqual((cm.exception.status, cm.exception.code), (404, "not_found"))

    def test_2_cli_documented_commands(self):
        env = env_for(Key.value)
        p = subprocess.run([sys.executable, "-m", "vertal2kubo", "run", "print('hello')"],
                           capture_output=True, text=True, env=env, timeout=120)
        self.assertEqual((p.returncode, p.stdout, p.stderr), (0, "hello\n", ""))
        p = subprocess.run([sys.executable, "-m", "vertal2kubo", "run", "console.log(6*7)", "--language", "javascript", "--timeout", "5"],
                           capture_output=True, text=True, env=env, timeout=120)
        self.assertEqual((p.returncode, p.stdout, p.stderr), (0, "42\n", ""))
        p = subprocess.run([sys.executable, "-m", "vertal2kubo", "run", "-", "-l", "bash"], input="echo out; echo err >&2; exit 4",
                           capture_output=True, text=True, env=env, timeout=120)
        self.assertEqual((p.returncode, p.stdout, p.stderr), (4, "out\n", "err\n"))
        p = subprocess.run([sys.executable, "-m", "vertal2kubo", "run", "x", "--timeout", "999"],
                           capture_output=True, text=True, env=env, timeout=120)
        self.assertEqual(p.returncode, 125)
        self.assertRegex(p.stderr, r"invalid_timeout: .*request id req_[0-9a-f]{32}")

    def test_2_cli_files_and_live_output(self):
        """--file, --env, --arg and -- in, --return/--out back, and the
        first line on stdout before the program has ended."""
        import tempfile
        import time
        d = tempfile.TemporaryDirectory()
        self.addCleanup(d.cleanup)
        data = os.path.join(d.name, "q3.csv")
        with open(data, "w") as f:
            f.write("a,b\n1,2\n")
        out = os.path.join(d.name, "results")
        code = ("import os, sys, time\n"
                "print('marker', flush=True)\n"
                "time.sleep(2)\n"
                "rows = open('in/data.csv').read().splitlines()\n"
                "os.makedirs('out/deep', exist_ok=True)\n"
                "open('out/deep/rows.txt', 'w').write(os.environ['MODE'] + ' ' + ' '.join(sys.argv[1:]) + ' ' + str(len(rows)))\n"
                "print('done')\n")
        p = subprocess.Popen([sys.executable, "-m", "vertal2kubo", "run", code, "--file", data + ":in/data.csv",
                              "--env", "MODE=fast", "--arg=--n", "--return", "out/**", "--out", out, "--", "3"],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env_for(Key.value))
        first = p.stdout.readline()
        first_at = time.monotonic()
        rest, err = p.communicate(timeout=120)
        ended_at = time.monotonic()
        self.assertEqual((p.returncode, first + rest), (0, "marker\ndone\n"), err)
        self.assertGreater(ended_at - first_at, 1.0, "the first line came only at the end: not streamed")
        with open(os.path.join(out, "out", "deep", "rows.txt")) as f:
            self.assertEqual(f.read(), "fast --n 3 2")
        self.assertIn("wrote " + os.path.join(out, "out", "deep", "rows.txt") + " (12 bytes)", err)

    def test_2_mcp_stdio(self):
        msgs = [
            {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {"protocolVersion": "2025-06-18", "capabilities": {},
                                                                           "clientInfo": {"name": "live", "version": "1"}}},
            {"jsonrpc": "2.0", "method": "notifications/initialized"},
            {"jsonrpc": "2.0", "id": 2, "method": "tools/list"},
            {"jsonrpc": "2.0", "id": 3, "method": "tools/call", "params": {"name": "run_code", "arguments": {"language": "python", "code": "print(6*7)"}}},
            {"jsonrpc": "2.0", "id": 4, "method": "tools/call", "params": {"name": "run_code", "arguments": {"language": "python", "code": "import sys; sys.exit(2)"}}},
            {"jsonrpc": "2.0", "id": 5, "method": "tools/call", "params": {"name": "get_usage", "arguments": {}}},
        ]
        p = subprocess.run([sys.executable, "-m", "vertal2kubo.mcp"], input="".join(json.dumps(m) + "\n" for m in msgs),
                           capture_output=True, text=True, env=env_for(Key.value), timeout=120)
        self.assertEqual(p.returncode, 0, p.stderr)
        replies = {r["id"]: r["result"] for r in map(json.loads, p.stdout.splitlines())}
        # This server offers sandboxes, so the sandbox tools are listed beside run_code and get_usage.
        want = sorted(["get_usage", "run_code"] + [t["name"] for t in _mcp_sandboxes.tool_definitions()])
        self.assertEqual(sorted(t["name"] for t in replies[2]["tools"]), want)
        self.assertGreater(len(want), 2)
        self.assertIn("42", replies[3]["content"][0]["text"])
        self.assertNotIn("isError", replies[3])
        self.assertEqual((replies[4]["isError"], replies[4]["structuredContent"]["exit_code"]), (True, 2))
        self.assertIn("limits", replies[5]["structuredContent"])

    def test_3_mcp_stdio_sandbox_round_trip(self):
        # One stdio session: create a sandbox, keep state in it across two commands, read a file, kill it.
        p = subprocess.Popen([sys.executable, "-m", "vertal2kubo.mcp"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True, env=env_for(Key.value))
        self.addCleanup(p.kill)
        ids = iter(range(1, 100))

        def call(method, params=None):
            i = next(ids)
            p.stdin.write(json.dumps({"jsonrpc": "2.0", "id": i, "method": method, "params": params or {}}) + "\n")
            p.stdin.flush()
            reply = json.loads(p.stdout.readline())
            self.assertEqual(reply["id"], i)
            return reply["result"]

        def tool(name, **args):
            return call("tools/call", {"name": name, "arguments": args})

        call("initialize", {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "live", "version": "1"}})
        p.stdin.write(json.dumps({"jsonrpc": "2.0", "method": "notifications/initialized"}) + "\n")
        created = tool("create_sandbox")
        self.assertNotIn("isError", created, created)
        sid = created["structuredContent"]["id"]
        try:
            wrote = tool("run_command", sandbox_id=sid, cmd="echo kept > state.txt")
            self.assertEqual(wrote["structuredContent"]["exit_code"], 0, wrote)
            self.assertIn("cpu_seconds", wrote["structuredContent"])
            again = tool("run_command", sandbox_id=sid, cmd="cat state.txt")
            self.assertEqual(again["structuredContent"]["stdout"], "kept\n", "the second command sees the first's file")
            read = tool("read_file", sandbox_id=sid, path="state.txt")
            self.assertEqual(read["structuredContent"]["content"], "kept\n")
        finally:
            killed = tool("kill_sandbox", sandbox_id=sid)
        self.assertEqual(killed["structuredContent"]["status"], "ended")
        gone = tool("run_command", sandbox_id=sid, cmd="true")
        self.assertTrue(gone["isError"])
        p.stdin.close()
        self.assertEqual(p.wait(timeout=30), 0)

    def test_9_docs_snippet_runs_as_written(self):
        old_key = Key.value
        code = DOCS_SNIPPET.replace('"https://vertalrun.com/api"', repr(URL)).replace('"kubo_sk_..."', repr(old_key))
        out = io.StringIO()
        namespace = {}
        with contextlib.redirect_stdout(out):
            exec(compile(code, "docs-snippet", "exec"), namespace)
        Key.value = namespace["client"].api_key
        lines = out.getvalue().splitlines()
        self.assertEqual(lines[0], "succeeded 45")
        self.assertEqual(lines[1], "")  # the stdout's own newline
        self.assertRegex(lines[2], r"^\d{10}$")
        self.assertIn("'executions':", lines[3])
        self.assertRegex(lines[4], r"^400 invalid_timeout req_[0-9a-f]{32}$")
        self.assertNotEqual(Key.value, old_key)
        with self.assertRaises(KuboError) as cm:
            KuboClient(URL, old_key).usage()
        self.assertEqual((cm.exception.status, cm.exception.code), (401, "unauthorized"), "the rotated key is revoked at once")


if __name__ == "__main__":
    unittest.main()
