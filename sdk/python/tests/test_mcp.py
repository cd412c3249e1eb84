"""Unit tests of the stdio MCP server against a local stub of the API."""

import io
import json
import os
import subprocess
import sys
import unittest

from vertal2kubo.client import KuboClient
from vertal2kubo.mcp import PROTOCOL_VERSIONS, Server, tool_definitions

from .stub import LANGUAGES, StubAPI

HERE = os.path.dirname(os.path.abspath(__file__))
PACKAGE_ROOT = os.path.dirname(HERE)
GOLDEN = os.path.join(PACKAGE_ROOT, "..", "..", "internal", "mcpserver", "testdata", "tools.golden.json")


class ToolsTest(unittest.TestCase):
    def test_same_tools_as_the_go_server(self):
        """The Go server's tools/list (rendered with the same languages) is
        the contract both servers keep."""
        if not os.path.exists(GOLDEN):
            self.skipTest("not in a repository checkout")
        with open(GOLDEN) as f:
            want = json.load(f)
        self.assertEqual(tool_definitions(LANGUAGES["languages"]), want)


class ServerTest(unittest.TestCase):
    def setUp(self):
        self.api = StubAPI().__enter__()
        self.addCleanup(self.api.__exit__)
        self.server = Server(KuboClient(self.api.url, "kubo_sk_test", max_retries=0), LANGUAGES["languages"])

    def call(self, name, args):
        reply = self.server.handle({"jsonrpc": "2.0", "id": 7, "method": "tools/call", "params": {"name": name, "arguments": args}})
        self.assertNotIn("error", reply, "tool problems must be tool results, not protocol errors")
        return reply["result"]

    def test_run_code(self):
        cases = [
            ("success", {"language": "python", "code": "print(6*7)"}, False,
             ["status: succeeded", "exit_code: 0", "--- stdout ---\n42\n", "--- stderr ---\n(empty)"], "succeeded"),
            ("failed program", {"language": "py", "code": "raise SystemExit(3)", "timeout_s": 5, "stdin": "x"}, True,
             ["status: failed", "exit_code: 3", "ValueError"], "failed"),
            ("timeout", {"language": "python", "code": "while True: pass", "timeout_s": 2}, True,
             ["status: timed_out", "killed when timeout_s ran out"], "timed_out"),
            ("quota", {"language": "python", "code": "quota"}, True,
             ["quota_exceeded", "daily quota of 100 executions reached", "HTTP 429", "req_q", "resets at 00:00 UTC"], None),
            ("missing code", {"language": "python"}, True, ["code is required"], None),
            ("unknown argument", {"language": "python", "code": "1", "memory": 5}, True, ['unknown field "memory"'], None),
            ("timeout below one", {"language": "python", "code": "1", "timeout_s": 0}, True, ["timeout_s must be at least 1"], None),
        ]
        for name, args, want_error, want_text, want_status in cases:
            with self.subTest(name):
                result = self.call("run_code", args)
                self.assertEqual(result.get("isError", False), want_error)
                text = result["content"][0]["text"]
                for w in want_text:
                    self.assertIn(w, text)
                structured = result.get("structuredContent")
                self.assertEqual(structured and structured["status"], want_status)

    def test_run_code_request(self):
        self.call("run_code", {"language": "py", "code": "raise SystemExit(3)", "timeout_s": 5, "stdin": "x"})
        [(_, path, _, body)] = self.api.requests
        self.assertEqual(json.loads(body), {"language": "py", "code": "raise SystemExit(3)", "timeout_s": 5, "stdin": "x"})

    def test_get_usage(self):
        result = self.call("get_usage", {})
        self.assertNotIn("isError", result)
        self.assertIn("plan: free", result["content"][0]["text"])
        self.assertEqual(result["structuredContent"]["limits"]["memory_mb"], 256)

    def test_unauthorized(self):
        server = Server(KuboClient(self.api.url, "kubo_sk_revoked", max_retries=0), None)
        reply = server.handle({"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": "get_usage", "arguments": {}}})
        self.assertTrue(reply["result"]["isError"])
        self.assertIn("unauthorized", reply["result"]["content"][0]["text"])

    def test_not_configured(self):
        server = Server(None, None, config_error="vertal2kubo.mcp is not configured: no API key")
        reply = server.handle({"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": "run_code", "arguments": {"language": "python", "code": "1"}}})
        self.assertTrue(reply["result"]["isError"])
        self.assertIn("no API key", reply["result"]["content"][0]["text"])

    def test_protocol(self):
        h = self.server.handle
        init = h({"jsonrpc": "2.0", "id": 1, "method": "initialize",
                  "params": {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}}})
        self.assertEqual(init["result"]["protocolVersion"], "2025-06-18")
        self.assertEqual(init["result"]["capabilities"], {"tools": {"listChanged": False}})
        future = h({"jsonrpc": "2.0", "id": 2, "method": "initialize", "params": {"protocolVersion": "2099-01-01"}})
        self.assertEqual(future["result"]["protocolVersion"], PROTOCOL_VERSIONS[0])
        self.assertIsNone(h({"jsonrpc": "2.0", "method": "notifications/initialized"}))
        self.assertEqual(h({"jsonrpc": "2.0", "id": 3, "method": "ping"}), {"jsonrpc": "2.0", "id": 3, "result": {}})
        self.assertEqual([t["name"] for t in h({"jsonrpc": "2.0", "id": 4, "method": "tools/list"})["result"]["tools"]],
                         ["get_usage", "run_code"])
        self.assertEqual(h({"jsonrpc": "2.0", "id": 5, "method": "resources/list"})["error"]["code"], -32601)
        self.assertEqual(h({"jsonrpc": "2.0", "id": 6, "method": "tools/call", "params": {"name": "nope"}})["error"]["code"], -32602)

    def test_serve_lines(self):
        lines = "\n".join(json.dumps(m) for m in [
            {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {"protocolVersion": "2025-11-25"}},
            {"jsonrpc": "2.0", "method": "notifications/initialized"},
            {"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {"name": "run_code", "arguments": {"language": "python", "code": "print(6*7)"}}},
        ]) + "\nnot json\n"
        out = io.StringIO()
        self.server.serve(io.StringIO(lines), out)
        replies = {json.dumps(r.get("id")): r for r in map(json.loads, out.getvalue().splitlines())}
        self.assertEqual(set(replies), {"1", "2", "null"})
        self.assertIn("42", replies["2"]["result"]["content"][0]["text"])
        self.assertEqual(replies["null"]["error"]["code"], -32700)


class StdioProcessTest(unittest.TestCase):
    def test_without_key_exits_at_once(self):
        env = {k: v for k, v in os.environ.items() if k != "KUBO_API_KEY"}
        env["PYTHONPATH"] = PACKAGE_ROOT
        p = subprocess.run([sys.executable, "-m", "vertal2kubo.mcp"], input="", capture_output=True, text=True, env=env, timeout=60)
        self.assertEqual((p.returncode, p.stdout), (2, ""))
        self.assertIn("KUBO_API_KEY", p.stderr)

    def test_python_m_vertal2kubo_mcp(self):
        with StubAPI() as api:
            env = dict(os.environ, KUBO_API_URL=api.url + "/api", KUBO_API_KEY="kubo_sk_test", PYTHONPATH=PACKAGE_ROOT)
            msgs = [
                {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {"protocolVersion": "2025-06-18", "capabilities": {},
                                                                               "clientInfo": {"name": "t", "version": "1"}}},
                {"jsonrpc": "2.0", "method": "notifications/initialized"},
                {"jsonrpc": "2.0", "id": 2, "method": "tools/list"},
                {"jsonrpc": "2.0", "id": 3, "method": "tools/call", "params": {"name": "run_code", "arguments": {"language": "python", "code": "print(6*7)"}}},
            ]
            p = subprocess.run([sys.executable, "-m", "vertal2kubo.mcp"], input="".join(json.dumps(m) + "\n" for m in msgs),
                               capture_output=True, text=True, env=env, timeout=60)
        self.assertEqual(p.returncode, 0, p.stderr)
        replies = {r["id"]: r for r in map(json.loads, p.stdout.splitlines())}
        self.assertEqual(sorted(replies), [1, 2, 3])
        self.assertIn("python 3.11.2", replies[2]["result"]["tools"][1]["description"], "versions come from GET /v1/languages")
        self.assertEqual(replies[3]["result"]["structuredContent"]["stdout"], "42\n")


if __name__ == "__main__":
    unittest.main()
