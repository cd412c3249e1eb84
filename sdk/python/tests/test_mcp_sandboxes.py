"""The stdio MCP server's sandbox tools against the local stub of the API
and its fake /v1/sandboxes routes (as internal/mcpserver/sandboxes_test.go
checks the Go server's)."""

import base64
import json
import unittest

from vertal2kubo.client import KuboClient
from vertal2kubo.mcp import Server
from vertal2kubo import _mcp_sandboxes

from .sandbox_stub import FakeSandboxes
from .stub import LANGUAGES, StubAPI, tiny_png


class SandboxToolsTest(unittest.TestCase):
    def setUp(self):
        self.api = StubAPI().__enter__()
        self.addCleanup(self.api.__exit__)
        self.fake = FakeSandboxes(self.api)
        self.client = KuboClient(self.api.url, "kubo_sk_test", max_retries=0)
        self.server = Server(self.client, LANGUAGES["languages"], with_sandboxes=True)

    def call(self, name, args):
        reply = self.server.handle({"jsonrpc": "2.0", "id": 7, "method": "tools/call",
                                    "params": {"name": name, "arguments": args}})
        self.assertNotIn("error", reply, "tool problems must be tool results, not protocol errors")
        json.dumps(reply)  # nothing JSON cannot carry
        return reply["result"]

    def ok(self, name, args):
        result = self.call(name, args)
        self.assertNotIn("isError", result, result)
        return result

    def create(self, **args):
        return self.ok("create_sandbox", args)["structuredContent"]["id"]

    def test_offers_sandboxes(self):
        self.assertTrue(_mcp_sandboxes.offers_sandboxes(self.client))
        bare = StubAPI().__enter__()
        self.addCleanup(bare.__exit__)
        self.assertFalse(_mcp_sandboxes.offers_sandboxes(KuboClient(bare.url, "kubo_sk_test", max_retries=0)))

    def test_nulls_left_out(self):
        # The API sends reason and ended_at as null on a running sandbox;
        # the output schema gives them one type, so they are left out.
        self.assertEqual(_mcp_sandboxes._structured({"id": "sbx_1", "reason": None, "ended_at": None, "metadata": None}),
                         {"id": "sbx_1", "metadata": None})

    def test_listed_and_described(self):
        init = self.server.handle({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {}})
        self.assertIn("create_sandbox", init["result"]["instructions"])
        names = [t["name"] for t in self.server.handle({"jsonrpc": "2.0", "id": 2, "method": "tools/list"})["result"]["tools"]]
        self.assertEqual(names, ["create_sandbox", "get_usage", "kill_sandbox", "list_files", "pause_sandbox",
                                 "read_file", "resume_sandbox", "run_code", "run_command", "write_file"])
        plain = Server(self.client, LANGUAGES["languages"])
        init = plain.handle({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {}})
        self.assertNotIn("create_sandbox", init["result"]["instructions"])
        reply = plain.handle({"jsonrpc": "2.0", "id": 3, "method": "tools/call",
                              "params": {"name": "create_sandbox", "arguments": {}}})
        self.assertEqual(reply["error"]["code"], -32602)

    def test_state_across_tools(self):
        created = self.ok("create_sandbox", {"metadata": {"task": "t1"}, "on_timeout": "pause", "timeout_s": 60,
                                              "files": [{"path": "seed.txt", "content": "c2VlZA==", "encoding": "base64"}]})
        sid = created["structuredContent"]["id"]
        text = created["content"][0]["text"]
        for want in [f"sandbox_id: {sid}\n", "status: running\n", "home: /home/user\n", "call kill_sandbox when done"]:
            self.assertIn(want, text)
        [(_, _, _, body)] = [r for r in self.api.requests if r[0] == "POST"]
        self.assertEqual(json.loads(body), {"timeout_s": 60, "metadata": {"task": "t1"}, "on_timeout": "pause",
                                            "files": [{"path": "seed.txt", "content": "seed", "encoding": "utf8"}]})

        wrote = self.ok("write_file", {"sandbox_id": sid, "path": "notes/a.txt", "content": "hello\n"})
        self.assertIn("wrote /home/user/notes/a.txt (6 bytes", wrote["content"][0]["text"])
        read = self.ok("read_file", {"sandbox_id": sid, "path": "notes/a.txt"})
        self.assertEqual(read["content"][0]["text"], "hello\n")
        self.assertEqual(read["structuredContent"], {"path": "notes/a.txt", "size": 6, "encoding": "utf8",
                                                     "content": "hello\n", "truncated": False})
        listed = self.ok("list_files", {"sandbox_id": sid, "path": "notes"})
        self.assertEqual([f["name"] for f in listed["structuredContent"]["files"]], ["a.txt"])
        self.assertIn("notes: 1 entries\n", listed["content"][0]["text"])

        echo = self.ok("run_command", {"sandbox_id": sid, "cmd": "echo hi"})
        self.assertIn("status: succeeded\nexit_code: 0\n", echo["content"][0]["text"])
        self.assertEqual(echo["structuredContent"]["stdout"], "hi\n")
        self.assertEqual(echo["structuredContent"]["cpu_seconds"], 0.001, "the wire's usage.cpu_seconds, on top as in vertal mcp")
        fail = self.call("run_command", {"sandbox_id": sid, "cmd": "fail 3"})
        self.assertTrue(fail["isError"])
        self.assertIn("exit_code: 3\n", fail["content"][0]["text"])
        self.assertIn("--- stderr ---\noops\n", fail["content"][0]["text"])

        paused = self.ok("pause_sandbox", {"sandbox_id": sid})
        self.assertEqual(paused["structuredContent"]["status"], "paused")
        resumed = self.ok("resume_sandbox", {"sandbox_id": sid})
        self.assertEqual(resumed["structuredContent"]["status"], "running")
        killed = self.ok("kill_sandbox", {"sandbox_id": sid})
        self.assertIn("status: ended\nreason: killed\n", killed["content"][0]["text"])
        gone = self.call("run_command", {"sandbox_id": sid, "cmd": "echo hi"})
        self.assertTrue(gone["isError"])
        self.assertIn("sandbox_not_running", gone["content"][0]["text"])
        self.assertIn("call create_sandbox for a new one", gone["content"][0]["text"])

    def test_create_network(self):
        """network reaches the API as the Go server sends it: left out or
        null is the plan's list, [] none, a list narrows; the record's
        network is in the text; a refusal says what to do."""
        for args, want in [({}, None), ({"network": None}, None), ({"network": []}, {"allow": []}),
                           ({"network": ["pypi.org"]}, {"allow": ["pypi.org"]})]:
            with self.subTest(args=args):
                self.ok("create_sandbox", args)
                body = json.loads(self.api.requests[-1][3])
                self.assertEqual(body.get("network"), want)
        self.assertIn("network: none\n", self.ok("create_sandbox", {"network": []})["content"][0]["text"])

        record = dict(next(iter(self.fake.sandboxes.values())), id="sbx_net",
                      limits={"memory_mb": 256, "network": {"allow": ["pypi.org"], "max_bytes": 1048576}},
                      network={"bytes_in": 10, "bytes_out": 2, "connections": 1, "refused": 0, "attempts": []})
        self.api.push("POST /v1/sandboxes", (201, {}, record))
        created = self.ok("create_sandbox", {"network": ["pypi.org"]})
        self.assertIn("network: allowed pypi.org (at most 1048576 bytes in all); connections: 1 made, 0 refused; "
                      "bytes: 10 in, 2 out\n", created["content"][0]["text"])
        self.assertEqual(created["structuredContent"]["limits"]["network"], {"allow": ["pypi.org"], "max_bytes": 1048576})

        message = 'network.allow names what your plan does not allow ("evil.example"); your plan allows ["pypi.org"]'
        self.api.push("POST /v1/sandboxes", (403, {}, {"error": {"code": "forbidden", "message": message},
                                                        "request_id": "req_n"}))
        refused = self.call("create_sandbox", {"network": ["evil.example"]})
        self.assertTrue(refused["isError"])
        self.assertEqual(refused["content"][0]["text"], f"Vertal Run API error forbidden: {message} (HTTP 403, request id req_n). "
                         + _mcp_sandboxes.NETWORK_HINT)

        # A malformed rule is a 400, which the plan's list does not explain.
        message = 'network.allow[0] "*.com": too wide a wildcard'
        self.api.push("POST /v1/sandboxes", (400, {}, {"error": {"code": "invalid_request", "message": message},
                                                        "request_id": "req_m"}))
        malformed = self.call("create_sandbox", {"network": ["*.com"]})
        self.assertEqual(malformed["content"][0]["text"],
                         f"Vertal Run API error invalid_request: {message} (HTTP 400, request id req_m).")

    def test_cells_keep_state(self):
        sid = self.create()
        first = self.ok("run_code", {"sandbox_id": sid, "language": "python", "code": "x = 42"})
        cid = first["structuredContent"]["context_id"]
        self.assertTrue(cid.startswith("ctx_"))
        second = self.ok("run_code", {"sandbox_id": sid, "language": "python", "code": "x", "context_id": cid})
        text = second["content"][0]["text"]
        self.assertIn(f"sandbox_id: {sid}\ncontext_id: {cid}\nexecution_count: 2\n", text)
        self.assertIn("--- result ---\n42\n", text)
        self.assertEqual(second["structuredContent"]["results"], [{"text/plain": "42"}])
        raised = self.call("run_code", {"sandbox_id": sid, "language": "python", "code": "raise ValueError"})
        self.assertTrue(raised["isError"])
        self.assertIn("--- error: ValueError ---\nTraceback", raised["content"][0]["text"])
        self.assertEqual(raised["structuredContent"]["error"]["name"], "ValueError")
        # No fresh program was run: the executions route was never called.
        self.assertFalse([r for r in self.api.requests if r[1].endswith("/v1/executions")])

    def test_refused_while_it_ran(self):
        """After run_command, and run_code with a sandbox_id, in a sandbox
        with a network, the result names the connections refused while it
        ran (the newest five), not those refused before (as Go's
        TestRefusedWhileItRan)."""
        sid = self.create()

        def record(*hosts, allow=("pypi.org",)):
            rec = dict(self.fake.record(sid), limits={"network": {"allow": list(allow), "max_bytes": 1048576}})
            rec["network"] = {"bytes_in": 0, "bytes_out": 0, "connections": 0, "refused": len(hosts), "attempts": [
                {"host": h, "port": 443, "kind": "tls", "allowed": False, "reason": f"{h} is not in the allowlist"}
                for h in hosts] + [{"host": "pypi.org", "port": 443, "kind": "tls", "allowed": True}]}
            return 200, {}, rec

        def refused(*hosts):
            return "".join(f"refused: {h}:443 (tls): {h} is not in the allowlist\n" for h in hosts)

        get = f"GET /v1/sandboxes/{sid}"
        self.api.push(get, record("old.test"), record("old.test", "a.test"))
        text = self.call("run_command", {"sandbox_id": sid, "cmd": "echo hi"})["content"][0]["text"]
        self.assertIn(f"sandbox_id: {sid}\nnetwork: 1 connection(s) refused while it ran\n{refused('a.test')}--- stdout ---",
                      text)

        seven = [f"{i}.test" for i in range(1, 8)]
        self.api.push(get, record(), record(*seven))
        text = self.call("run_command", {"sandbox_id": sid, "cmd": "echo hi"})["content"][0]["text"]
        self.assertIn("network: 7 connection(s) refused while it ran; the newest 5:\n" + refused(*seven[2:]) + "--- stdout ---",
                      text)

        self.api.push(get, record("old.test"), record("old.test"))
        self.assertNotIn("network:", self.call("run_command", {"sandbox_id": sid, "cmd": "echo hi"})["content"][0]["text"])
        self.api.push(get, record(allow=()))  # no network: no second look
        self.assertNotIn("network:", self.call("run_command", {"sandbox_id": sid, "cmd": "echo hi"})["content"][0]["text"])

        cell = {"context_id": "ctx_1", "status": "succeeded", "stdout": "", "stderr": "", "error": None,
                "execution_count": 1, "duration_ms": 3, "truncated": False, "results": []}
        self.api.push(f"POST /v1/sandboxes/{sid}/run", (200, {}, cell))
        self.api.push(get, record(), record("d.test"))
        text = self.ok("run_code", {"sandbox_id": sid, "language": "python", "code": "x"})["content"][0]["text"]
        self.assertIn("duration_ms: 3\nnetwork: 1 connection(s) refused while it ran\n" + refused("d.test") + "--- stdout ---",
                      text)

    def test_cell_results_as_content(self):
        sid = self.create()
        png = tiny_png()
        cell = {"context_id": "ctx_1", "status": "succeeded", "stdout": "", "stderr": "", "error": None,
                "execution_count": 1, "duration_ms": 3, "truncated": False, "results": [
                    {"main": False, "data": {"text/plain": "<Figure>", "image/png": base64.b64encode(png).decode()}},
                    {"main": True, "data": {"text/plain": "   a\n0  1", "text/html": "<table><tr><td>1</td></tr></table>"}}]}
        self.api.push(f"POST /v1/sandboxes/{sid}/run", (200, {}, cell))
        result = self.ok("run_code", {"sandbox_id": sid, "language": "python", "code": "df"})
        content = result["content"]
        self.assertEqual([c["type"] for c in content], ["text", "image", "resource"])
        self.assertEqual(base64.b64decode(content[1]["data"]), png)
        self.assertEqual(content[2]["resource"], {"uri": f"vertal://sandboxes/{sid}/contexts/ctx_1/results/2.html",
                                                  "mimeType": "text/html", "text": "<table><tr><td>1</td></tr></table>"})
        self.assertIn("--- figure 1: image below ---\n", content[0]["text"])
        self.assertIn("--- result ---\n   a\n0  1\n", content[0]["text"])
        # Images are in the content once, not again in the structured results.
        self.assertEqual(result["structuredContent"]["results"], [
            {"text/plain": "<Figure>"}, {"text/plain": "   a\n0  1", "text/html": "<table><tr><td>1</td></tr></table>"}])

    def test_read_file_binary_and_long(self):
        sid = self.create()
        self.ok("write_file", {"sandbox_id": sid, "path": "b.bin", "content": "/wD+", "encoding": "base64"})
        binary = self.ok("read_file", {"sandbox_id": sid, "path": "b.bin"})
        self.assertEqual(binary["structuredContent"]["encoding"], "base64")
        self.assertEqual(binary["content"][0]["text"], "/wD+")
        self.assertIn("base64-encoded", binary["content"][1]["text"])
        # Over the cap, cut inside a two-byte character: the text keeps
        # only whole characters and says how long the file is.
        big = "é" * (_mcp_sandboxes.READ_FILE_CAP // 2 + 10)
        self.ok("write_file", {"sandbox_id": sid, "path": "big.txt", "content": big})
        long = self.ok("read_file", {"sandbox_id": sid, "path": "big.txt"})
        s = long["structuredContent"]
        self.assertEqual((s["encoding"], s["truncated"], s["size"]), ("utf8", True, len(big.encode())))
        self.assertEqual(len(s["content"].encode()), _mcp_sandboxes.READ_FILE_CAP)
        self.assertIn(f"the file has {len(big.encode())} bytes", long["content"][1]["text"])

    def test_refused_arguments(self):
        sid = self.create()
        cases = [
            ("create_sandbox", {"timeout_s": 0}, "timeout_s must be at least 1"),
            ("create_sandbox", {"on_timeout": "explode"}, 'on_timeout must be kill or pause, not "explode"'),
            ("create_sandbox", {"memory": 1}, 'unknown field "memory"'),
            ("create_sandbox", {"files": [{"content": "x"}]}, "files[0].path is required"),
            ("create_sandbox", {"files": [{"path": "a", "content": "!!", "encoding": "base64"}]}, "not valid base64"),
            ("create_sandbox", {"env": 5}, "invalid arguments: env must be an object of strings"),
            ("create_sandbox", {"env": {"A": 1}}, 'invalid arguments: env["A"] must be a string'),
            ("create_sandbox", {"network": "pypi.org"}, "network must be a list of rules"),
            ("create_sandbox", {"network": ["allowed.test", None]}, "invalid arguments: network[1] must be a string"),
            ("create_sandbox", {"NETWORK": ["allowed.test"]}, 'unknown field "NETWORK"'),
            ("create_sandbox", {"network": [], "Network": None}, 'unknown field "Network"'),
            ("create_sandbox", {"network": [7]}, "network[0] must be a string"),
            ("run_command", {"sandbox_id": sid}, "argument cmd is required"),
            ("run_command", {"cmd": "ls"}, "argument sandbox_id is required"),
            ("run_command", {"sandbox_id": sid, "cmd": "ls", "timeout_s": 0}, "timeout_s must be at least 1"),
            ("run_command", {"sandbox_id": sid, "cmd": "ls", "timeout_s": "5"}, "timeout_s must be an integer"),
            ("write_file", {"sandbox_id": sid, "path": "a"}, 'content is required ("" for an empty file)'),
            ("write_file", {"sandbox_id": sid, "path": "a", "content": "x", "encoding": "hex"}, "utf8 or base64"),
            ("read_file", {"sandbox_id": sid}, "argument path is required"),
            ("kill_sandbox", {}, "argument sandbox_id is required"),
            ("kill_sandbox", {"sandbox_id": "sbx_nope"}, "not_found"),
            ("run_code", {"context_id": "ctx_1", "language": "python", "code": "1"}, "context_id needs sandbox_id"),
            ("run_code", {"sandbox_id": sid, "language": "python", "code": "1", "stdin": "x"}, "do not apply"),
            ("run_code", {"sandbox_id": sid, "language": "python", "code": "1", "network": []}, "do not apply"),
        ]
        for name, args, want in cases:
            with self.subTest(name=name, args=args):
                result = self.call(name, args)
                self.assertTrue(result.get("isError"), result)
                self.assertIn(want, result["content"][0]["text"])

    def test_without_sandboxes_a_cell_is_refused(self):
        plain = Server(self.client, LANGUAGES["languages"])
        reply = plain.handle({"jsonrpc": "2.0", "id": 7, "method": "tools/call", "params": {
            "name": "run_code", "arguments": {"sandbox_id": "sbx_1", "language": "python", "code": "1"}}})
        self.assertTrue(reply["result"]["isError"])
        self.assertIn("does not offer sandboxes", reply["result"]["content"][0]["text"])


if __name__ == "__main__":
    unittest.main()
