"""Unit tests of vertal2kubo.sandbox (sandboxes that stay) against the
local stub of the API with its fake /v1/sandboxes routes."""

import json
import threading
import unittest

from vertal2kubo import Sandbox
from vertal2kubo.client import KuboError

from .sandbox_stub import FakeSandboxes
from .stub import StubAPI, sse_event
from .test_client import client_for


def header(headers, name):
    return {k.lower(): v for k, v in headers.items()}.get(name.lower())


class SandboxTest(unittest.TestCase):
    def setUp(self):
        self.api = StubAPI().__enter__()
        self.addCleanup(self.api.__exit__)
        self.fake = FakeSandboxes(self.api)
        self.client = client_for(self.api, "/api")
        self.sbx = self.client.create_sandbox(timeout_s=300, metadata={"job": "csv"}, env={"MODE": "x"},
                                              files={"in/data.csv": "a,b\n", "blob.bin": b"\x00\xff"},
                                              on_timeout="pause")
        self.api.requests.clear()

    def last(self):
        method, path, headers, body = self.api.requests[-1]
        return method, path, headers, (json.loads(body) if body and header(headers, "Content-Type") == "application/json" else body)

    def test_create_sends_the_documented_body_and_a_key(self):
        api = self.api
        key_sent = None
        sbx = self.client.create_sandbox("datasci", 60, metadata={"a": "b"}, files={"x.bin": b"\x00"})
        method, path, headers, body = self.last()
        key_sent = header(headers, "Idempotency-Key")
        self.assertEqual((method, path), ("POST", "/v1/sandboxes"))
        self.assertEqual(body, {"image": "datasci", "timeout_s": 60, "metadata": {"a": "b"},
                                "files": [{"path": "x.bin", "content": "AA==", "encoding": "base64"}]})
        self.assertRegex(key_sent, r"^vertal-[0-9a-f]{32}$")
        self.assertIsInstance(sbx, Sandbox)
        self.assertEqual((sbx.status, sbx.info["image"]), ("running", "datasci"))
        self.assertRegex(sbx.id, r"^sbx_")
        # The first sandbox's files landed under /home/user, decoded.
        self.assertEqual(self.fake.files[self.sbx.id], {"/home/user/in/data.csv": b"a,b\n", "/home/user/blob.bin": b"\x00\xff"})
        self.assertEqual(self.sbx.info["on_timeout"], "pause")
        # A given key is sent as is, and a retry after a 503 reuses it: one sandbox.
        api.push("POST /v1/sandboxes", (503, {"Retry-After": "1"}, {"error": {"code": "overloaded", "message": "busy"}}))
        again = self.client.create_sandbox(idempotency_key="job-7")
        keys = [header(h, "Idempotency-Key") for m, p, h, _ in api.requests[-2:]]
        self.assertEqual(keys, ["job-7", "job-7"])
        self.assertEqual(self.client.slept, [1.0])
        self.assertEqual(self.client.create_sandbox(idempotency_key="job-7").id, again.id)

    def test_create_with_network(self):
        self.client.create_sandbox(network=["pypi.org", "*.pythonhosted.org"])
        self.assertEqual(self.last()[3], {"network": {"allow": ["pypi.org", "*.pythonhosted.org"]}})
        self.client.create_sandbox(network=[])
        self.assertEqual(self.last()[3], {"network": {"allow": []}})
        self.client.create_sandbox()
        self.assertNotIn("network", self.last()[3])
        with self.assertRaises(TypeError):
            self.client.create_sandbox(network="pypi.org")

    def test_create_refused(self):
        with self.assertRaises(KuboError) as cm:
            self.client.create_sandbox("missing")
        self.assertEqual((cm.exception.status, cm.exception.code, cm.exception.request_id),
                         (400, "invalid_request", "req_sbx"))

    def test_lifecycle(self):
        sbx = self.sbx
        self.assertIs(sbx.pause(), sbx)
        self.assertEqual(sbx.status, "paused")
        self.assertEqual(self.last()[:2], ("POST", f"/v1/sandboxes/{sbx.id}/pause"))
        self.assertEqual(sbx.resume().status, "running")
        self.assertEqual(sbx.set_timeout(600).info["expires_at"], "2026-12-02T16:10:00Z")
        self.assertEqual(self.last()[3], {"timeout_s": 600})
        with self.assertRaises(KuboError) as cm:
            sbx.set_timeout(99999)
        self.assertEqual((cm.exception.status, cm.exception.code), (400, "invalid_timeout"))
        self.fake.sandboxes[sbx.id]["status"] = "paused"  # paused elsewhere
        self.assertEqual(sbx.refresh().status, "paused")
        killed = sbx.kill()
        self.assertEqual((killed.status, killed.info["reason"]), ("ended", "killed"))
        self.assertEqual(self.last()[:2], ("DELETE", f"/v1/sandboxes/{sbx.id}"))
        with self.assertRaises(KuboError) as cm:
            sbx.commands.run("echo hi")
        self.assertEqual((cm.exception.status, cm.exception.code), (409, "sandbox_not_running"))
        with self.assertRaises(KuboError) as cm:
            self.client.get_sandbox("sbx_00").refresh()
        self.assertEqual((cm.exception.status, cm.exception.code), (404, "not_found"))
        self.assertEqual(self.client.get_sandbox(sbx.id).status, "ended")

    def test_list_filters_and_pages(self):
        second = self.client.create_sandbox(metadata={"job": "other"})
        page = self.client.list_sandboxes(metadata={"job": "csv"})
        self.assertEqual([s.id for s in page["sandboxes"]], [self.sbx.id])
        self.assertEqual(page["next_cursor"], None)
        self.assertEqual(self.last()[1], "/v1/sandboxes?metadata.job=csv")
        page = self.client.list_sandboxes(status="running", limit=1)
        self.assertEqual(([s.id for s in page["sandboxes"]], page["next_cursor"]), ([second.id], "1"))
        page = self.client.list_sandboxes(status="running", limit=1, cursor=page["next_cursor"])
        self.assertEqual(([s.id for s in page["sandboxes"]], page["next_cursor"]), ([self.sbx.id], None))
        self.assertEqual(self.last()[1], "/v1/sandboxes?status=running&limit=1&cursor=1")

    def test_run(self):
        r = self.sbx.commands.run("echo hello", cwd="/tmp", env={"A": "1"}, timeout_s=5)
        self.assertEqual((r["status"], r["stdout"], r["exit_code"], r["usage"]), ("succeeded", "hello\n", 0, {"cpu_seconds": 0.001}))
        self.assertEqual(self.last()[3], {"cmd": "echo hello", "cwd": "/tmp", "env": {"A": "1"}, "timeout_s": 5})
        r = self.sbx.commands.run(argv=["fail", "3"], stdin="in\n")
        self.assertEqual((r["status"], r["stdout"], r["stderr"], r["exit_code"]), ("failed", "in\n", "oops\n", 3))
        self.assertEqual(self.last()[3], {"argv": ["fail", "3"], "stdin": "in\n"})
        with self.assertRaises(TypeError):
            self.sbx.commands.run("x", argv=["x"])
        with self.assertRaises(TypeError):
            self.sbx.commands.run()

    def test_run_is_not_retried_after_a_503(self):
        self.api.push(f"POST /v1/sandboxes/{self.sbx.id}/commands",
                      (503, {"Retry-After": "1"}, {"error": {"code": "overloaded", "message": "busy"}}))
        with self.assertRaises(KuboError) as cm:
            self.sbx.commands.run("echo once")
        self.assertEqual(cm.exception.code, "overloaded")
        self.assertEqual(len(self.api.requests), 1)

    def test_stream(self):
        events = list(self.sbx.commands.stream("fail 2"))
        self.assertEqual(header(self.api.requests[-1][2], "Accept"), "text/event-stream")
        self.assertEqual([(e["type"], e["id"]) for e in events], [("stderr", "1"), ("result", "end")])
        self.assertEqual(events[0]["text"], "oops\n")
        self.assertEqual((events[-1]["result"]["exit_code"], events[-1]["result"]["stderr"]), (2, "oops\n"))

    def test_stream_yields_while_the_command_runs(self):
        gate = threading.Event()
        result = {"pid": 1, "status": "succeeded", "stdout": "a\nb\n", "stderr": "", "exit_code": 0}
        self.api.push(f"POST /v1/sandboxes/{self.sbx.id}/commands", (200, {}, [
            sse_event("1", "stdout", {"text": "a\n"}), lambda: gate.wait(30),
            sse_event("2", "stdout", {"data": "b\n"}), sse_event("3", "future_kind", {}), sse_event("end", "result", result)]))
        it = self.sbx.commands.stream("slow")
        first = next(it)
        self.assertEqual((first["type"], first["text"]), ("stdout", "a\n"))
        gate.set()
        rest = list(it)
        self.assertEqual([e["type"] for e in rest], ["stdout", "result"])
        self.assertEqual(rest[0]["text"], "b\n")  # {"data"} read as well as {"text"}

    def test_stream_error_event_and_cut_stream(self):
        path = f"POST /v1/sandboxes/{self.sbx.id}/commands"
        self.api.push(path, (200, {}, [sse_event("1", "stdout", {"text": "a\n"}),
                                       sse_event("end", "error", {"error": {"code": "sandbox_not_running", "message": "it ended"},
                                                                  "request_id": "req_e"})]))
        it = self.sbx.commands.stream("x")
        self.assertEqual(next(it)["text"], "a\n")
        with self.assertRaises(KuboError) as cm:
            next(it)
        self.assertEqual((cm.exception.status, cm.exception.code, cm.exception.request_id), (0, "sandbox_not_running", "req_e"))
        self.api.push(path, (200, {}, [sse_event("1", "stdout", {"text": "a\n"})]))
        with self.assertRaises(KuboError) as cm:
            list(self.sbx.commands.stream("x"))
        self.assertEqual(cm.exception.code, "connection_failed")
        n = len(self.api.requests)
        self.api.push(path, (409, {}, {"error": {"code": "sandbox_not_running", "message": "ended"}}))
        with self.assertRaises(KuboError) as cm:
            list(self.sbx.commands.stream("x"))
        self.assertEqual((cm.exception.status, cm.exception.code), (409, "sandbox_not_running"))
        self.assertEqual(len(self.api.requests), n + 1, "a stream is never posted twice")

    def test_stream_from_a_json_answer(self):
        result = {"pid": 1, "status": "succeeded", "stdout": "x\n", "stderr": "", "exit_code": 0}
        self.api.push(f"POST /v1/sandboxes/{self.sbx.id}/commands", (200, {}, result))
        events = list(self.sbx.commands.stream("x"))
        self.assertEqual([e["type"] for e in events], ["stdout", "result"])
        self.assertEqual(events[-1]["result"], result)

    def test_background_stdin_signal_list(self):
        c = self.sbx.commands
        cmd = c.start("sleep 100")
        self.assertEqual((cmd["pid"], cmd["running"]), (100, True))
        self.assertEqual(self.last()[3], {"cmd": "sleep 100", "background": True})
        for status in (202, 200):  # a server that answers 202 or 200 is read the same
            self.api.push(f"POST /v1/sandboxes/{self.sbx.id}/commands", (status, {}, dict(cmd, pid=7)))
            self.assertEqual(c.start(argv=["cat"])["pid"], 7)
        self.api.push(f"POST /v1/sandboxes/{self.sbx.id}/commands", (201, {}, {"running": True}))
        with self.assertRaises(KuboError) as cm:
            c.start("x")
        self.assertEqual(cm.exception.code, "invalid_response")
        self.assertIsNone(c.send_stdin(100, "hi\n"))
        c.send_stdin(100, eof=True)
        self.assertEqual(self.fake.stdin, [(100, {"data": "hi\n"}), (100, {"eof": True})])
        with self.assertRaises(ValueError):
            c.send_stdin(100)
        self.assertEqual([x["running"] for x in c.list()], [True])
        c.signal(100)
        self.assertEqual(self.fake.signals, [(100, "TERM")])
        self.assertEqual([(x["running"], x["exit_code"]) for x in c.list()], [(False, 143)])
        with self.assertRaises(KuboError) as cm:
            c.signal(100, "KILL")
        self.assertEqual((cm.exception.status, cm.exception.code), (409, "process_finished"))
        with self.assertRaises(KuboError) as cm:
            c.send_stdin(999, "x")
        self.assertEqual((cm.exception.status, cm.exception.code), (404, "not_found"))

    def test_events_attach_resume_and_reconnect(self):
        pid = self.sbx.commands.start("job")["pid"]
        events = list(self.sbx.commands.events(pid))
        self.assertEqual([(e["type"], e["id"]) for e in events], [("stdout", "1"), ("stderr", "2"), ("stdout", "3"), ("exit", "4")])
        self.assertEqual((events[0]["text"], events[-1]["exit_code"]), ("one\n", 0))
        resumed = list(self.sbx.commands.events(pid, last_event_id="2"))
        self.assertEqual([e["id"] for e in resumed], ["3", "4"])
        self.assertEqual(header(self.api.requests[-1][2], "Last-Event-ID"), "2")
        self.assertEqual(list(self.sbx.commands.events(pid, last_event_id="4")), [])
        # A stream cut after event 1 is resumed with Last-Event-ID 1.
        route = f"GET /v1/sandboxes/{self.sbx.id}/commands/{pid}/events"
        self.api.push(route, (200, {}, [sse_event("1", "stdout", {"text": "one\n"})]))
        n = len(self.api.requests)
        events = list(self.sbx.commands.events(pid))
        self.assertEqual("".join(e.get("text", "") for e in events), "one\ntwo\nthree\n")
        self.assertEqual([header(h, "Last-Event-ID") for _, _, h, _ in self.api.requests[n:]], [None, "1"])

    def test_files(self):
        f = self.sbx.files
        data = bytes(range(256)) * 4
        info = f.write("/home/user/deep/dir/data.bin", data)
        self.assertEqual((info["path"], info["size"], info["type"]), ("/home/user/deep/dir/data.bin", 1024, "file"))
        self.assertEqual(self.fake.uploads[-1], ("/home/user/deep/dir/data.bin", data, "application/octet-stream"))
        self.assertEqual(self.last()[:2], ("PUT", f"/v1/sandboxes/{self.sbx.id}/files?path=%2Fhome%2Fuser%2Fdeep%2Fdir%2Fdata.bin"))
        self.assertEqual(f.read("/home/user/deep/dir/data.bin"), data)
        f.write("notes.txt", "café")
        self.assertEqual(f.read("/home/user/notes.txt"), "café".encode())
        # A file whose bytes are JSON is still bytes.
        f.write("x.json", b'{"entries": []}')
        self.assertEqual(f.read("x.json"), b'{"entries": []}')
        self.assertEqual([(e["name"], e["type"]) for e in f.list("/home/user/deep/dir")], [("data.bin", "file")])
        with self.assertRaises(IsADirectoryError):
            f.read("/home/user/deep")
        with self.assertRaises(NotADirectoryError):
            f.list("/home/user/notes.txt")
        self.assertEqual(f.mkdir("/home/user/out")["type"], "dir")
        self.assertEqual(self.last()[3], {"path": "/home/user/out"})
        moved = f.move("/home/user/notes.txt", "/home/user/out/notes.txt")
        self.assertEqual(moved["path"], "/home/user/out/notes.txt")
        self.assertEqual(self.last()[3], {"from": "/home/user/notes.txt", "to": "/home/user/out/notes.txt"})
        self.assertIn("out", [e["name"] for e in f.list()])
        self.assertIsNone(f.remove("/home/user/deep"))
        for call in (lambda: f.read("/home/user/deep/dir/data.bin"), lambda: f.remove("/home/user/nothing"),
                     lambda: f.move("/home/user/nothing", "/home/user/x")):
            with self.assertRaises(KuboError) as cm:
                call()
            self.assertEqual((cm.exception.status, cm.exception.code), (404, "not_found"))
        with self.assertRaises(KuboError) as cm:
            f.write("/etc/passwd", b"x")
        self.assertEqual((cm.exception.status, cm.exception.code), (403, "forbidden"))
        with self.assertRaises(KuboError) as cm:
            f.write("big.bin", b"\0" * ((10 << 20) + 1))
        self.assertEqual((cm.exception.status, cm.exception.code), (413, "payload_too_large"))
        with self.assertRaises(ValueError):
            f.read("")
        with self.assertRaises(TypeError):
            f.write("x", 3)

    def test_a_read_is_retried_after_a_503(self):
        route = f"GET /v1/sandboxes/{self.sbx.id}/files?path=blob.bin"
        self.api.push(route, (503, {"Retry-After": "1"}, {"error": {"code": "overloaded", "message": "busy"}}))
        self.assertEqual(self.sbx.files.read("blob.bin"), b"\x00\xff")
        self.assertEqual(self.client.slept, [1.0])

    def test_bad_answers(self):
        self.api.push(f"GET /v1/sandboxes/{self.sbx.id}", (200, {}, {"status": "running"}))
        with self.assertRaises(KuboError) as cm:
            self.sbx.refresh()
        self.assertEqual(cm.exception.code, "invalid_response")
        self.api.push("GET /v1/sandboxes", (200, {}, {"items": []}))
        with self.assertRaises(KuboError) as cm:
            self.client.list_sandboxes()
        self.assertEqual(cm.exception.code, "invalid_response")
        with self.assertRaises(ValueError):
            self.client.get_sandbox("")


if __name__ == "__main__":
    unittest.main()


class SandboxCLITest(unittest.TestCase):
    def setUp(self):
        import os
        from unittest import mock
        self.api = StubAPI().__enter__()
        self.addCleanup(self.api.__exit__)
        self.fake = FakeSandboxes(self.api)
        patcher = mock.patch.dict(os.environ, {"KUBO_API_URL": self.api.url + "/api", "KUBO_API_KEY": "kubo_sk_test"})
        patcher.start()
        self.addCleanup(patcher.stop)

    def cli(self, *argv):
        import io
        from vertal2kubo.__main__ import main
        out, err = io.StringIO(), io.StringIO()
        code = main(list(argv), stdin=io.StringIO(""), stdout=out, stderr=err)
        return code, out.getvalue(), err.getvalue()

    def test_create_ls_exec_cp_pause_resume_rm(self):
        import os
        import tempfile
        code, out, err = self.cli("sandbox", "create", "--timeout", "60", "--meta", "job=csv", "--on-timeout", "pause")
        self.assertEqual(code, 0, err)
        sid = out.strip()
        self.assertEqual((self.fake.sandboxes[sid]["metadata"], self.fake.sandboxes[sid]["on_timeout"]), ({"job": "csv"}, "pause"))
        code, out, _ = self.cli("sandbox", "ls")
        self.assertEqual((code, out.split()[:2]), (0, [sid, "running"]))
        self.assertEqual(self.cli("sandbox", "exec", sid, "echo", "hi"), (0, "hi\n", ""))
        self.assertEqual(self.cli("sandbox", "exec", sid, "fail 4"), (4, "", "oops\n"))
        d = tempfile.TemporaryDirectory()
        self.addCleanup(d.cleanup)
        local, back = os.path.join(d.name, "in.bin"), os.path.join(d.name, "back.bin")
        with open(local, "wb") as f:
            f.write(b"\x00\x01data")
        code, _, err = self.cli("sandbox", "cp", local, sid + ":/home/user/x/in.bin")
        self.assertEqual((code, err), (0, "wrote /home/user/x/in.bin (6 bytes)\n"))
        self.assertEqual(self.cli("sandbox", "cp", sid + ":/home/user/x/in.bin", back)[0], 0)
        with open(back, "rb") as f:
            self.assertEqual(f.read(), b"\x00\x01data")
        self.assertEqual(self.cli("sandbox", "cp", local, back)[0], 2)
        self.assertEqual(self.cli("sandbox", "pause", sid), (0, f"{sid} paused\n", ""))
        self.assertEqual(self.cli("sandbox", "resume", sid), (0, f"{sid} running\n", ""))
        self.assertEqual(self.cli("sandbox", "rm", sid), (0, f"{sid} ended\n", ""))
        code, _, err = self.cli("sandbox", "exec", sid, "echo", "late")
        self.assertEqual(code, 125)
        self.assertIn("sandbox_not_running", err)
        code, _, err = self.cli("sandbox", "rm", "sbx_00")
        self.assertEqual(code, 125)
        self.assertIn("not_found", err)


    def test_create_network(self):
        for flags, want in [([], None), (["--allow", "pypi.org", "--allow", "*.pythonhosted.org"], {"allow": ["pypi.org", "*.pythonhosted.org"]}),
                            (["--no-network"], {"allow": []})]:
            with self.subTest(flags=flags):
                self.api.requests.clear()
                code, _, err = self.cli("sandbox", "create", *flags)
                self.assertEqual(code, 0, err)
                posts = [json.loads(b) for m, _, _, b in self.api.requests if m == "POST"]
                self.assertEqual(posts[-1].get("network"), want)
        self.assertEqual(self.cli("sandbox", "create", "--allow", "pypi.org", "--no-network"),
                         (2, "", "vertal2kubo sandbox create: --allow and --no-network cannot go together\n"))


class CodeContextTest(unittest.TestCase):
    """run_code, stream_code and contexts against the stub."""

    def setUp(self):
        self.api = StubAPI().__enter__()
        self.addCleanup(self.api.__exit__)
        self.fake = FakeSandboxes(self.api)
        self.client = client_for(self.api, "/api")
        self.sbx = self.client.create_sandbox()

    def test_cells_keep_state(self):
        first = self.sbx.run_code("x = 41", timeout_s=5)
        method, path, headers, body = self.api.requests[-1]
        self.assertEqual((method, path), ("POST", f"/v1/sandboxes/{self.sbx.id}/run"))
        self.assertEqual(json.loads(body), {"code": "x = 41", "timeout_s": 5})
        self.assertEqual(first["status"], "succeeded")
        second = self.sbx.run_code("x")
        self.assertEqual(second["results"], [{"main": True, "data": {"text/plain": "41"}}])
        self.assertEqual((second["context_id"], second["execution_count"]), (first["context_id"], 2))
        failed = self.sbx.run_code("raise ValueError")
        self.assertEqual((failed["status"], failed["error"]["name"]), ("failed", "ValueError"))

    def test_contexts(self):
        js = self.sbx.contexts.create("javascript")
        self.assertEqual((js["language"], js["default"]), ("javascript", False))
        self.assertEqual(self.sbx.run_code("x", context_id=js["id"])["results"][0]["data"]["text/plain"], "x")
        self.assertEqual([c["id"] for c in self.sbx.contexts.list()], [js["id"]])
        self.sbx.run_code("y = 1", context_id=js["id"])
        self.sbx.contexts.restart(js["id"])
        self.assertEqual(self.sbx.run_code("y", context_id=js["id"])["results"][0]["data"]["text/plain"], "y")
        self.sbx.contexts.delete(js["id"])
        with self.assertRaises(KuboError) as cm:
            self.sbx.run_code("1", context_id=js["id"])
        self.assertEqual((cm.exception.status, cm.exception.code), (404, "not_found"))
        with self.assertRaises(KuboError) as cm:
            self.sbx.contexts.create("cobol")
        self.assertEqual(cm.exception.code, "unsupported_language")

    def test_stream_code(self):
        events = list(self.sbx.stream_code("print(hi)"))
        self.assertEqual([e["type"] for e in events], ["stdout", "end"])
        self.assertEqual(events[0]["text"], "hi\n")
        self.assertEqual(events[-1]["result"]["stdout"], "hi\n")
        events = list(self.sbx.stream_code("raise KeyError"))
        self.assertEqual(events[0]["error"]["name"], "KeyError")
        self.assertEqual(events[-1]["result"]["status"], "failed")
        _, _, headers, _ = self.api.requests[-1]
        self.assertEqual(header(headers, "Accept"), "text/event-stream")
