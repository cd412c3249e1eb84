"""Unit tests of the stdio MCP server against a local stub of the API."""

import base64
import io
import json
import os
import subprocess
import sys
import unittest

from vertal2kubo.client import KuboClient
from vertal2kubo._sniff import detect_content_type
from vertal2kubo.mcp import PROTOCOL_VERSIONS, Server, file_content, files_line, network_text, tool_definitions

from .stub import FETCH_EXECUTION, IMAGES, LANGUAGES, MADE_FILES, OK_EXECUTION, StubAPI, tiny_png

HERE = os.path.dirname(os.path.abspath(__file__))
PACKAGE_ROOT = os.path.dirname(HERE)
GOLDEN = os.path.join(PACKAGE_ROOT, "..", "..", "internal", "mcpserver", "testdata", "tools.golden.json")
# vertal mcp's tools/list when the API has sandboxes that stay.
SANDBOX_GOLDEN = os.path.join(os.path.dirname(GOLDEN), "stdio_sandbox_tools.golden.json")


class ToolsTest(unittest.TestCase):
    def test_same_tools_as_the_go_server(self):
        """The Go server's tools/list (rendered with the same languages) is
        the contract both servers keep."""
        if not os.path.exists(GOLDEN):
            self.skipTest("not in a repository checkout")
        with open(GOLDEN) as f:
            want = json.load(f)
        self.assertEqual(tool_definitions(LANGUAGES["languages"], IMAGES["images"]), want)

    def test_same_sandbox_tools_as_the_go_server(self):
        if not os.path.exists(SANDBOX_GOLDEN):
            self.skipTest("not in a repository checkout")
        with open(SANDBOX_GOLDEN) as f:
            want = json.load(f)
        self.assertEqual(tool_definitions(LANGUAGES["languages"], IMAGES["images"], with_sandboxes=True), want)


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
             ["status: succeeded", "exit_code: 0", "image: datasci (build 20261201T092047Z-19222)\nexecution_id: ",
              "--- stdout ---\n42\n", "--- stderr ---\n(empty)"], "succeeded"),
            ("failed program", {"language": "py", "code": "raise SystemExit(3)", "timeout_s": 5, "stdin": "x"}, True,
             ["status: failed", "exit_code: 3", "image: default\nexecution_id: ", "ValueError"], "failed"),
            ("timeout", {"language": "python", "code": "while True: pass", "timeout_s": 2}, True,
             ["status: timed_out", "killed when timeout_s ran out"], "timed_out"),
            ("quota", {"language": "python", "code": "quota"}, True,
             ["quota_exceeded", "daily quota of 100 executions reached", "HTTP 429", "req_q", "resets at 00:00 UTC"], None),
            ("missing code", {"language": "python"}, True, ["code is required"], None),
            ("unknown argument", {"language": "python", "code": "1", "memory": 5}, True, ['unknown field "memory"'], None),
            ("timeout below one", {"language": "python", "code": "1", "timeout_s": 0}, True, ["timeout_s must be at least 1"], None),
            ("network", {"language": "python", "code": "fetch", "network": ["pypi.org"]}, True,
             ["execution_id: exe_4\nnetwork: allowed pypi.org; connections: 1 made, 1 refused; bytes: 5120 in, 312 out\n"
              "refused: example.com:443 (tls): example.com is not in the allowlist\n--- stdout ---\n200\n"], "failed"),
            ("no network", {"language": "python", "code": "print(6*7)", "network": []}, False,
             ["execution_id: exe_9392448a9b514e3f90193963b7d948d0\n--- stdout ---\n42\n"], "succeeded"),
            ("network not a list", {"language": "python", "code": "1", "network": "pypi.org"}, True,
             ['invalid arguments: network must be a list of rules (strings such as "pypi.org"), [] for no network, '
              "or left out for the plan's whole list"], None),
            ("network with null", {"language": "python", "code": "1", "network": ["allowed.test", None]}, True,
             ["invalid arguments: network[1] must be a string"], None),
            ("network in capitals", {"language": "python", "code": "1", "NETWORK": ["allowed.test"]}, True,
             ['invalid arguments: unknown field "NETWORK"'], None),
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

    def test_run_code_network_request(self):
        """network reaches the API as the Go server sends it: left out or
        null is the plan's allowlist, [] none."""
        for args, want in [({}, None), ({"network": None}, None), ({"network": []}, {"allow": []}),
                           ({"network": ["pypi.org"]}, {"allow": ["pypi.org"]})]:
            with self.subTest(args=args):
                result = self.call("run_code", dict(args, language="python", code="fetch"))
                self.assertEqual(json.loads(self.api.requests[-1][3]).get("network"), want)
                self.assertEqual(result["structuredContent"]["network"], FETCH_EXECUTION["network"])

    def test_run_code_network_refused(self):
        """A host beyond the plan's list is the API's refusal, with what to
        do (as the Go server says it)."""
        message = 'network.allow names what your plan does not allow ("evil.example"); your plan allows ["pypi.org"]'
        self.api.push("POST /v1/executions", (403, {}, {"error": {"code": "forbidden", "message": message},
                                                         "request_id": "req_n"}))
        result = self.call("run_code", {"language": "python", "code": "fetch", "network": ["evil.example"]})
        self.assertTrue(result["isError"])
        self.assertEqual(result["content"][0]["text"], f"Vertal Run API error forbidden: {message} (HTTP 403, request id req_n). "
                         "The network argument may list only what the plan's egress allowlist covers; leave network out "
                         "for the plan's whole list, or pass [] for none.")

    def test_run_code_network_malformed(self):
        """A malformed rule (a 400) comes back without the hint about the
        plan's list, which does not explain it."""
        message = 'network.allow[0] "*.com": too wide a wildcard'
        self.api.push("POST /v1/executions", (400, {}, {"error": {"code": "invalid_request", "message": message},
                                                         "request_id": "req_m"}))
        result = self.call("run_code", {"language": "python", "code": "fetch", "network": ["*.com"]})
        self.assertTrue(result["isError"])
        self.assertEqual(result["content"][0]["text"],
                         f"Vertal Run API error invalid_request: {message} (HTTP 400, request id req_m).")

    def test_network_text(self):
        """As TestNetworkText in Go: each refusal once, with how often it
        came, and at most ten of them."""
        def refused(host):
            return {"host": host, "port": 443, "kind": "tls", "allowed": False, "reason": f"{host} is not in the allowlist"}
        self.assertEqual(network_text(None), "")
        self.assertEqual(network_text({"allow": ["pypi.org", "*.pythonhosted.org"], "connections": 2, "refused": 0,
                                       "bytes_in": 10, "bytes_out": 1,
                                       "attempts": [{"host": "pypi.org", "port": 443, "kind": "tls", "allowed": True}]}),
                         "network: allowed pypi.org, *.pythonhosted.org; connections: 2 made, 0 refused; bytes: 10 in, 1 out\n")
        self.assertEqual(network_text({"allow": ["pypi.org"], "connections": 1, "refused": 2, "bytes_in": 0, "bytes_out": 0,
                                       "attempts": [refused("example.com"),
                                                    {"host": "pypi.org", "port": 443, "kind": "tls", "allowed": True,
                                                     "reason": "cut at the byte bound"},
                                                    refused("example.com")]}),
                         "network: allowed pypi.org; connections: 1 made, 2 refused; bytes: 0 in, 0 out\n"
                         "refused: example.com:443 (tls): example.com is not in the allowlist (2 times)\n"
                         "cut: pypi.org:443 (tls): cut at the byte bound\n")
        many = network_text({"allow": ["pypi.org"], "connections": 0, "refused": 13, "bytes_in": 0, "bytes_out": 0,
                             "attempts": [refused(f"h{i}.example") for i in range(12)] + [refused("h0.example")]})
        lines = many.splitlines()
        self.assertEqual(len(lines), 12)
        self.assertEqual(lines[1], "refused: h0.example:443 (tls): h0.example is not in the allowlist (2 times)")
        self.assertEqual(lines[10], "refused: h9.example:443 (tls): h9.example is not in the allowlist")
        self.assertEqual(lines[11], "(2 more refused or cut connections in the structured content)")

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
        self.assertEqual(init["result"]["capabilities"], {"tools": {}})  # as TestCapabilities in Go
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


class ReturnedFilesTest(unittest.TestCase):
    """run_code's files, env, args and return_files, and the returned files
    as MCP content, as internal/mcpserver/files_test.go checks them."""

    def setUp(self):
        self.api = StubAPI().__enter__()
        self.addCleanup(self.api.__exit__)
        self.server = Server(KuboClient(self.api.url, "kubo_sk_test", max_retries=0), LANGUAGES["languages"])

    def call(self, args):
        reply = self.server.handle({"jsonrpc": "2.0", "id": 7, "method": "tools/call",
                                    "params": {"name": "run_code", "arguments": args}})
        self.assertNotIn("error", reply)
        return reply["result"]

    def test_image_and_resources(self):
        png = MADE_FILES["chart.png"]
        result = self.call({
            "language": "python", "code": "make()",
            "files": [{"path": "in/a.csv", "content": "x,y\n"}, {"path": "b.bin", "content": "AAE=", "encoding": "base64"}],
            "env": {"MODE": "fast"}, "args": ["--n", "3"], "return_files": ["*.png", "*.csv", "*.bin"],
        })
        self.assertNotIn("isError", result)

        # Every argument reached the API; b.bin's bytes (00 01) are sent as
        # base64 again by the client, since they hold a NUL.
        [(_, _, _, body)] = self.api.requests
        self.assertEqual(json.loads(body), {
            "language": "python", "code": "make()",
            "files": [{"path": "in/a.csv", "content": "x,y\n", "encoding": "utf8"},
                      {"path": "b.bin", "content": "AAE=", "encoding": "base64"}],
            "env": {"MODE": "fast"}, "args": ["--n", "3"], "return_files": ["*.png", "*.csv", "*.bin"],
        })

        content = result["content"]
        self.assertEqual([c["type"] for c in content], ["text", "resource", "image", "resource", "resource"])
        text = content[0]["text"]
        self.assertIn(f"files: b.bin (2 bytes), chart.png ({len(png)} bytes), data.csv (17 bytes), notes.bin (4 bytes)\n"
                      "--- stdout ---\nmake()\n", text)
        self.assertEqual(content[2], {"type": "image", "mimeType": "image/png", "data": base64.b64encode(png).decode()})
        self.assertEqual([c["resource"] for c in content[1:] if c["type"] == "resource"], [
            {"uri": "vertal://executions/exe_9392448a9b514e3f90193963b7d948d0/files/b.bin",
             "mimeType": "text/plain; charset=utf-8", "text": "\x00\x01"},
            {"uri": "vertal://executions/exe_9392448a9b514e3f90193963b7d948d0/files/data.csv",
             "mimeType": "text/plain; charset=utf-8", "text": "city,temp\nOslo,3\n"},
            {"uri": "vertal://executions/exe_9392448a9b514e3f90193963b7d948d0/files/notes.bin",
             "mimeType": "application/octet-stream", "blob": "/wD+AQ=="},
        ])

        # The structured result lists the files without their bytes a second time.
        structured = result["structuredContent"]
        self.assertEqual(structured["files"], [{"path": "b.bin", "size": 2}, {"path": "chart.png", "size": len(png)},
                                               {"path": "data.csv", "size": 17}, {"path": "notes.bin", "size": 4}])
        self.assertIs(structured["files_truncated"], False)
        json.dumps(result)  # nothing in it that JSON cannot carry

    def test_truncated_and_no_files(self):
        self.api.push("POST /v1/executions", (200, {}, dict(OK_EXECUTION, files=[], files_truncated=True)))
        result = self.call({"language": "python", "code": "1", "return_files": ["*"]})
        self.assertEqual(len(result["content"]), 1)
        self.assertIn("execution_id: exe_9392448a9b514e3f90193963b7d948d0\nfiles: (none); files_truncated: true",
                      result["content"][0]["text"])
        result = self.call({"language": "python", "code": "print(6*7)"})
        self.assertNotIn("files:", result["content"][0]["text"])

    def test_refused_arguments(self):
        cases = [
            ("unknown file field", {"files": [{"path": "a", "content": "x", "mode": 7}]}, 'unknown field "mode"'),
            ("missing path", {"files": [{"content": "x"}]}, "files[0].path is required"),
            ("bad encoding", {"files": [{"path": "a", "content": "x"}, {"path": "b", "content": "x", "encoding": "hex"}]},
             'files[1].encoding must be utf8 or base64, not "hex"'),
            ("bad base64", {"files": [{"path": "a", "content": "!!", "encoding": "base64"}]}, "files[0].content is not valid base64"),
            ("base64 without padding", {"files": [{"path": "a", "content": "AAE", "encoding": "base64"}]}, "files[0].content is not valid base64"),
            ("base64 with stray bits", {"files": [{"path": "a", "content": "AAF=", "encoding": "base64"}]}, "files[0].content is not valid base64"),
            ("files not a list", {"files": {"a": "x"}}, "invalid arguments"),
            ("env not strings", {"env": {"N": 3}}, "invalid arguments"),
            ("args not strings", {"args": ["a", 1]}, "invalid arguments: args[1] must be a string"),
            ("return_files not a list", {"return_files": "*.png"}, "invalid arguments: return_files must be an array"),
        ]
        for name, extra, want in cases:
            with self.subTest(name):
                self.api.requests.clear()
                result = self.call(dict({"language": "python", "code": "1"}, **extra))
                self.assertTrue(result.get("isError"))
                self.assertIn(want, result["content"][0]["text"])
                self.assertEqual(self.api.requests, [], "refused arguments must not reach the API")

    def test_base64_line_breaks_accepted(self):
        """Go's strict decoder still skips CR and LF; so does this one."""
        self.call({"language": "python", "code": "1", "files": [{"path": "a", "content": "AA\r\nE=", "encoding": "base64"}]})
        self.assertEqual(json.loads(self.api.requests[0][3])["files"], [{"path": "a", "content": "AAE=", "encoding": "base64"}])

    def test_bad_base64_from_the_api(self):
        self.api.push("POST /v1/executions", (200, {}, dict(OK_EXECUTION, files=[{"path": "x", "size": 1, "encoding": "base64", "content": "%%%"}])))
        result = self.call({"language": "python", "code": "1", "return_files": ["x"]})
        self.assertTrue(result["isError"])
        self.assertIn("could not read", result["content"][0]["text"])


class FileContentTest(unittest.TestCase):
    def test_file_content(self):
        svg = b'<svg xmlns="http://www.w3.org/2000/svg"><script>alert(1)</script></svg>'
        cases = [
            # name, path, data, image MIME type ("" for a resource), text resource, URI
            ("png", "plot.png", tiny_png(), "image/png", False, ""),
            ("png named as text", "plot.txt", tiny_png(), "image/png", False, ""),
            ("gif", "a.gif", b"GIF89a\x01\x00\x01\x00\x00\x00\x00;", "image/gif", False, ""),
            ("jpeg", "a.jpg", b"\xff\xd8\xff\xe0\x00\x10JFIF\x00", "image/jpeg", False, ""),
            ("webp", "a.webp", b"RIFF\x1a\x00\x00\x00WEBPVP8 ", "image/webp", False, ""),
            ("bmp is not shown inline", "a.bmp", b"BM\x00\x00\xff", "", False, "vertal://executions/exe_1/files/a.bmp"),
            ("text named as png", "fake.png", b"just text", "", True, "vertal://executions/exe_1/files/fake.png"),
            ("svg is markup, not an image", "logo.svg", svg, "", True, "vertal://executions/exe_1/files/logo.svg"),
            ("path parts escaped", "out/a b#?.txt", b"x", "", True, "vertal://executions/exe_1/files/out/a%20b%23%3F.txt"),
            ("escaped as url.PathEscape", "r\u00e9sum\u00e9 (1)!;,$&+:=@~.txt", b"x", "", True,
             "vertal://executions/exe_1/files/r%C3%A9sum%C3%A9%20%281%29%21%3B%2C$&+:=@~.txt"),
            ("invalid utf-8 is a blob", "x.dat", b"ok\xffno", "", False, "vertal://executions/exe_1/files/x.dat"),
            ("empty file", "empty", b"", "", True, "vertal://executions/exe_1/files/empty"),
        ]
        for name, path, data, want_image, want_text, want_uri in cases:
            with self.subTest(name):
                c = file_content("exe_1", path, data)
                if want_image:
                    self.assertEqual(c, {"type": "image", "mimeType": want_image, "data": base64.b64encode(data).decode()})
                    continue
                self.assertEqual(c["type"], "resource")
                r = c["resource"]
                self.assertEqual(r["uri"], want_uri)
                if want_text:
                    self.assertEqual(r.get("text"), data.decode())
                    self.assertNotIn("blob", r)
                    self.assertTrue(r["mimeType"].startswith("text/"), r["mimeType"])
                else:
                    self.assertEqual(base64.b64decode(r["blob"]), data)
                    self.assertNotIn("text", r)

    def test_files_line(self):
        cases = [
            ([], False, ""),
            ([{"path": "a.png", "size": 10}], False, "files: a.png (10 bytes)\n"),
            ([], True, "files: (none); files_truncated: true (the plan's caps on count or size left some matching files out)\n"),
        ]
        for files, truncated, want in cases:
            with self.subTest(want):
                self.assertEqual(files_line(files, truncated), want)

    def test_sniffing_matches_go(self):
        """Results of Go's http.DetectContentType for the same bytes."""
        cases = [
            (b"", "text/plain; charset=utf-8"),
            (b"\x00", "application/octet-stream"),
            (b"  <!doctype html>", "text/html; charset=utf-8"),
            (b"<p>", "text/html; charset=utf-8"),
            (b"<pre>", "text/plain; charset=utf-8"),
            (b"\n<?xml version", "text/xml; charset=utf-8"),
            (b"<svg></svg>", "text/plain; charset=utf-8"),
            (b"%PDF-1.7", "application/pdf"),
            (b"\xef\xbb\xbfhi", "text/plain; charset=utf-8"),
            (b"\xff\xfeh\x00", "text/plain; charset=utf-16le"),
            (b"\x00\x00\x00\x18ftypmp42\x00\x00\x00\x00mp41isom", "video/mp4"),
            (b"PK\x03\x04", "application/zip"),
            (b"\x1f\x8b\x08\x00", "application/x-gzip"),
            (b"caf\xc3\xa9", "text/plain; charset=utf-8"),
            (b"\x1b[0m", "text/plain; charset=utf-8"),
            (b"\x00\x01", "application/octet-stream"),
            (b"BM\x00\x00\xff", "image/bmp"),
            (b"a" * 512 + b"\x00", "text/plain; charset=utf-8"),
        ]
        for data, want in cases:
            with self.subTest(data[:20]):
                self.assertEqual(detect_content_type(data), want)


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
