"""Unit tests of files, env, args, returned files and streaming in
vertal2kubo.client, against the local stub of the API."""

import json
import threading
import unittest

from vertal2kubo.client import KuboError, _SSEParser

from .stub import StubAPI, sse_event
from .test_client import client_for

RESULT = {"id": "exe_1", "status": "succeeded", "stdout": "hello\nmore\n", "stderr": "oops\n", "exit_code": 0,
          "duration_ms": 5, "truncated": False, "usage": {"sandbox_seconds": 0.005}, "request_id": "req_s",
          "files": [{"path": "out/a.bin", "size": 3, "encoding": "base64", "content": "AAH/"}], "files_truncated": False}
DECODED = dict(RESULT, files=[{"path": "out/a.bin", "size": 3, "content": b"\x00\x01\xff"}])

STARTED = sse_event("0-0", "started", {"id": "exe_1", "language": "python"})
HELLO = sse_event("6-0", "stdout", {"text": "hello\n"})
OOPS = sse_event("6-5", "stderr", {"text": "oops\n"})
MORE = sse_event("11-5", "stdout", {"text": "more\n"})
END = sse_event("end", "result", RESULT)

EVENTS = [
    {"type": "started", "id": "0-0", "execution_id": "exe_1", "language": "python"},
    {"type": "stdout", "id": "6-0", "execution_id": "exe_1", "text": "hello\n"},
    {"type": "stderr", "id": "6-5", "execution_id": "exe_1", "text": "oops\n"},
    {"type": "stdout", "id": "11-5", "execution_id": "exe_1", "text": "more\n"},
    {"type": "result", "id": "end", "execution_id": "exe_1", "execution": DECODED},
]


def header(headers, name):
    """A request header, whatever case urllib gave its name."""
    return {k.lower(): v for k, v in headers.items()}.get(name.lower())


def routes(api):
    return [(m, p, header(h, "Last-Event-ID")) for m, p, h, _ in api.requests]


class FilesTest(unittest.TestCase):
    def test_request_and_returned_files(self):
        with StubAPI() as api:
            api.push("POST /v1/executions", (200, {}, RESULT))
            result = client_for(api).run(
                "import sys", files={"data.csv": "a,b\n1,2\n", "in/logo.png": b"\x89PNG\r\n", "nul.txt": b"a\x00b", "t.txt": b"caf\xc3\xa9"},
                env={"MODE": "fast"}, args=["--n", "3"], return_files=["*.png", "out/**"])
            self.assertEqual(result, DECODED)
            body = json.loads(api.requests[0][3])
            self.assertEqual(body, {
                "language": "python", "code": "import sys",
                "files": [
                    {"path": "data.csv", "content": "a,b\n1,2\n", "encoding": "utf8"},
                    {"path": "in/logo.png", "content": "iVBORw0K", "encoding": "base64"},
                    {"path": "nul.txt", "content": "YQBi", "encoding": "base64"},
                    {"path": "t.txt", "content": "café", "encoding": "utf8"},
                ],
                "env": {"MODE": "fast"}, "args": ["--n", "3"], "return_files": ["*.png", "out/**"],
            })

    def test_pairs_and_bad_content(self):
        with StubAPI() as api:
            client_for(api).run("x", files=[("a.txt", "A"), ("a/b.txt", b"B")])
            self.assertEqual([f["path"] for f in json.loads(api.requests[0][3])["files"]], ["a.txt", "a/b.txt"])
            with self.assertRaises(TypeError):
                client_for(api).run("x", files={"n": 3})

    def test_bad_base64_in_answer(self):
        with StubAPI() as api:
            api.push("POST /v1/executions", (200, {}, dict(RESULT, files=[{"path": "x", "size": 1, "encoding": "base64", "content": "!!"}])))
            with self.assertRaises(KuboError) as cm:
                client_for(api).run("x")
            self.assertEqual(cm.exception.code, "invalid_response")


class StreamTest(unittest.TestCase):
    def setUp(self):
        self.api = StubAPI().__enter__()
        self.addCleanup(self.api.__exit__)

    def test_cases(self):
        cases = [
            ("events in order; heartbeats and unknown types skipped",
             [(200, {}, [STARTED, ": heartbeat\n\n", HELLO, "event: progress\ndata: {}\n\n", OOPS, MORE, END])],
             EVENTS, [("POST", "/v1/executions", None)]),
            ("CRLF and CR line endings, chunks split anywhere",
             [(200, {}, [c for e in (STARTED, HELLO, OOPS, MORE, END) for c in (e.replace("\n", "\r\n")[:7], e.replace("\n", "\r\n")[7:])])],
             EVENTS, [("POST", "/v1/executions", None)]),
            ("refused first, retried",
             [(503, {"Retry-After": "1"}, {"error": {"code": "overloaded", "message": "busy"}, "request_id": "r"}),
              (200, {}, [STARTED, HELLO, OOPS, MORE, END])],
             EVENTS, [("POST", "/v1/executions", None)] * 2),
            ("a dropped stream reattaches after the last event",
             [(200, {}, [STARTED, HELLO])],
             EVENTS, [("POST", "/v1/executions", None), ("GET", "/v1/executions/exe_1/events", "6-0")]),
            ("dropped before started: the same POST again",
             [(200, {}, [": heartbeat\n\n"]), (200, {}, [STARTED, HELLO, OOPS, MORE, END])],
             EVENTS, [("POST", "/v1/executions", None)] * 2),
            ("a server that does not stream",
             [(200, {}, dict(RESULT))],
             [{"type": "started", "id": "0-0", "execution_id": "exe_1", "language": None},
              {"type": "stdout", "id": "11-0", "execution_id": "exe_1", "text": "hello\nmore\n"},
              {"type": "stderr", "id": "11-5", "execution_id": "exe_1", "text": "oops\n"},
              {"type": "result", "id": "end", "execution_id": "exe_1", "execution": DECODED}],
             [("POST", "/v1/executions", None)]),
        ]
        for name, script, want, want_routes in cases:
            with self.subTest(name):
                self.api.requests.clear()
                self.api.script.clear()
                self.api.push("POST /v1/executions", *script[:2] if "POST again" in name or "retried" in name else script[:1])
                if "reattaches" in name:
                    self.api.push("GET /v1/executions/{id}", (200, {}, [OOPS, MORE, END]))
                got = list(client_for(self.api).stream("print('hello')", idempotency_key="k-1"))
                self.assertEqual(got, want)
                self.assertEqual(routes(self.api), want_routes)
                for _, _, headers, body in self.api.requests:
                    self.assertEqual(header(headers, "Accept"), "text/event-stream")
                    if body:
                        self.assertEqual((header(headers, "Idempotency-Key"), json.loads(body)), ("k-1", {"language": "python", "code": "print('hello')"}))

    def test_refusal_raises(self):
        self.api.push("POST /v1/executions", (400, {}, {"error": {"code": "invalid_request", "message": "files[0].path: must be relative"}, "request_id": "req_b"}))
        with self.assertRaises(KuboError) as cm:
            list(client_for(self.api).stream("x"))
        self.assertEqual((cm.exception.status, cm.exception.code, cm.exception.request_id), (400, "invalid_request", "req_b"))

    def test_error_event_raises_after_the_output(self):
        self.api.push("POST /v1/executions", (200, {}, [STARTED, HELLO, sse_event("end", "error", {"error": {"code": "internal", "message": "the sandbox failed"}})]))
        seen = []
        with self.assertRaises(KuboError) as cm:
            for event in client_for(self.api).stream("x"):
                seen.append(event["type"])
        self.assertEqual(seen, ["started", "stdout"])
        e = cm.exception
        self.assertEqual((e.status, e.code, e.message, e.request_id), (0, "internal", "the sandbox failed", "req_stream"))

    def test_gives_up_after_retries(self):
        self.api.push("POST /v1/executions", (200, {}, [STARTED]))
        for _ in range(3):
            self.api.push("GET /v1/executions/{id}", (200, {}, []))
        c = client_for(self.api)
        with self.assertRaises(KuboError) as cm:
            list(c.stream("x"))
        self.assertEqual(cm.exception.code, "connection_failed")
        self.assertEqual(len(c.slept), 3)

    def test_leaving_the_loop_closes_the_connection(self):
        release = threading.Event()
        self.api.push("POST /v1/executions", (200, {}, [STARTED, HELLO, lambda: release.wait(10), MORE, END]))
        gen = client_for(self.api).stream("x")
        self.assertEqual(next(gen)["type"], "started")
        self.assertEqual(next(gen)["type"], "stdout")
        gen.close()  # what a break out of a for loop does
        release.set()
        self.assertEqual(len(self.api.requests), 1, "no reconnect after the caller left")

    def test_live_output_arrives_before_the_end(self):
        release = threading.Event()
        self.api.push("POST /v1/executions", (200, {}, [STARTED, HELLO, lambda: release.wait(10), OOPS, MORE, END]))
        gen = client_for(self.api).stream("x")
        next(gen)
        self.assertEqual(next(gen)["text"], "hello\n")  # while the server still holds the rest
        self.assertFalse(release.is_set())
        release.set()
        self.assertEqual([e["type"] for e in gen], ["stderr", "stdout", "result"])


class AttachTest(unittest.TestCase):
    def test_cases(self):
        cases = [
            ("from the start", None, [STARTED, HELLO, OOPS, MORE, END], EVENTS),
            ("after an event", "6-5", [MORE, END], EVENTS[3:]),
            ("after the end", "end", [], []),
        ]
        with StubAPI() as api:
            for name, last_id, chunks, want in cases:
                with self.subTest(name):
                    api.requests.clear()
                    api.push("GET /v1/executions/{id}", (200, {}, chunks))
                    self.assertEqual(list(client_for(api).attach("exe_1", last_event_id=last_id)), want)
                    self.assertEqual(routes(api), [("GET", "/v1/executions/exe_1/events", last_id)])
                    self.assertEqual(header(api.requests[0][2], "Accept"), "text/event-stream")
            api.push("GET /v1/executions/{id}", (404, {}, {"error": {"code": "not_found", "message": "no such execution"}, "request_id": "req_n"}))
            with self.assertRaises(KuboError) as cm:
                list(client_for(api).attach("exe_0"))
            self.assertEqual((cm.exception.status, cm.exception.code), (404, "not_found"))
            with self.assertRaises(ValueError):
                client_for(api).attach("")


class SSEParserTest(unittest.TestCase):
    def test_spec_cases(self):
        cases = [
            ("joined data lines", "data: one\ndata:two\ndata:  three\ndata\n\n", [("", "message", "one\ntwo\n three\n")], ""),
            ("comments and unknown fields", ": hi\nfoo: bar\nretry: 5\ndata: x\n\n", [("", "message", "x")], ""),
            ("CR, LF and CRLF", "event: a\r\ndata: 1\r\n\r\nevent: b\rdata: 2\r\rdata: 3\n\n",
             [("", "a", "1"), ("", "b", "2"), ("", "message", "3")], ""),
            ("an id without data is kept", "id: 7\nevent: stdout\n\ndata: y\n\n", [("7", "message", "y")], "7"),
            ("an id with NUL is ignored", "id: 1\ndata: a\n\nid: 2\x003\ndata: b\n\n", [("1", "message", "a"), ("1", "message", "b")], "1"),
            ("a byte order mark", "\ufeffdata: x\n\n", [("", "message", "x")], ""),
            ("cut off at the end", "data: whole\n\ndata: cut", [("", "message", "whole")], ""),
        ]
        for name, text, want, want_last in cases:
            with self.subTest(name):
                for step in (len(text.encode()) or 1, 1):  # whole, and one byte at a time
                    p = _SSEParser()
                    raw = text.encode()
                    got = []
                    for i in range(0, len(raw), step):
                        got += p.feed(raw[i:i + step])
                    got += p.finish()
                    self.assertEqual(got, want)
                    self.assertEqual(p.last_id, want_last)


if __name__ == "__main__":
    unittest.main()
