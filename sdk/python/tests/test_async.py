"""Unit tests of submit, wait and batch in vertal2kubo.client, against the
local stub of the API."""

import json
import threading
import time
import unittest

from vertal2kubo.client import KuboError

from .stub import StubAPI, queued, sse_event
from .test_client import OVERLOADED, QUOTA, client_for
from .test_stream import DECODED, END, HELLO, RESULT, STARTED

RUNNING = dict(queued("exe_1"), status="running")
CRASHED = dict(queued("exe_1"), status="error", reason="the node running it stopped",
               webhook={"url": "https://hooks.example.com/v", "state": "failed", "attempts": 7, "last_status": 500, "last_error": "HTTP 500"})
NOT_FOUND = (404, {}, {"error": {"code": "not_found", "message": "no such execution"}, "request_id": "req_n"})
ERROR_EVENT = sse_event("end", "error", {"error": {"code": "internal", "message": "node lost"}})


class AsyncTestCase(unittest.TestCase):
    def setUp(self):
        self.api = StubAPI().__enter__()
        self.addCleanup(self.api.__exit__)

    def paths(self):
        # urllib sends the header as "Last-event-id".
        return [(m, p, {k.lower(): v for k, v in h.items()}.get("last-event-id")) for m, p, h, _ in self.api.requests]


class SubmitTest(AsyncTestCase):
    def test_queued_with_webhook(self):
        c = client_for(self.api)
        got = c.submit("print(1)", webhook_url="https://hooks.example.com/v", idempotency_key="job-7", env={"K": "v"})
        self.assertEqual(got, queued("exe_q", "https://hooks.example.com/v"))
        [(method, path, headers, body)] = self.api.requests
        self.assertEqual((method, path, headers["Idempotency-Key"]), ("POST", "/v1/executions", "job-7"))
        self.assertEqual(json.loads(body), {"language": "python", "code": "print(1)", "env": {"K": "v"},
                                            "async": True, "webhook_url": "https://hooks.example.com/v"})

    def test_retried_under_the_same_key(self):
        self.api.push("POST /v1/executions", OVERLOADED)
        c = client_for(self.api)
        self.assertEqual(c.submit("print(1)")["status"], "queued")
        keys = [h["Idempotency-Key"] for _, _, h, _ in self.api.requests]
        self.assertEqual(len(keys), 2)
        self.assertEqual(keys[0], keys[1])
        self.assertNotIn("webhook_url", json.loads(self.api.requests[0][3]))

    def test_refusals(self):
        for name, reply, code, tries in [
            ("a bad webhook", (400, {}, {"error": {"code": "invalid_request", "message": "webhook_url: loopback address refused"}, "request_id": "req_b"}), "invalid_request", 1),
            ("quota is not retried", QUOTA, "quota_exceeded", 1),
            ("no id in the answer", (202, {}, {"status": "queued"}), "invalid_response", 1),
        ]:
            with self.subTest(name):
                self.api.requests.clear()
                self.api.push("POST /v1/executions", reply)
                with self.assertRaises(KuboError) as cm:
                    client_for(self.api).submit("print(1)")
                self.assertEqual(cm.exception.code, code)
                self.assertEqual(len(self.api.requests), tries)


class WaitTest(AsyncTestCase):
    def test_cases(self):
        events = "/v1/executions/exe_1/events"
        cases = [
            ("the result event of the stream", [(200, {}, [STARTED, ": heartbeat\n\n", HELLO, END])], DECODED,
             [("GET", events, None)], 0),
            ("an error event: polls until final", [(200, {}, [STARTED, ERROR_EVENT]), (200, {}, RUNNING), (200, {}, CRASHED)], CRASHED,
             [("GET", events, None), ("GET", "/v1/executions/exe_1", None), ("GET", "/v1/executions/exe_1", None)], 1),
            ("a stream that keeps breaking: polls", [(200, {}, [STARTED])] + [(200, {}, [])] * 3 + [(200, {}, RESULT)], DECODED,
             [("GET", events, None)] + [("GET", events, "0-0")] * 3 + [("GET", "/v1/executions/exe_1", None)], 3),
            ("no events route: polls", [NOT_FOUND, (200, {}, RESULT)], DECODED,
             [("GET", events, None), ("GET", "/v1/executions/exe_1", None)], 0),
        ]
        for name, script, want, want_paths, want_sleeps in cases:
            with self.subTest(name):
                self.api.requests.clear()
                self.api.script.clear()
                self.api.push("GET /v1/executions/{id}", *script)
                c = client_for(self.api)
                self.assertEqual(c.wait("exe_1"), want)
                self.assertEqual(self.paths(), want_paths)
                self.assertEqual(len(c.slept), want_sleeps)
                self.assertTrue(all(0 < s <= 5 for s in c.slept), c.slept)

    def test_unknown_id(self):
        self.api.push("GET /v1/executions/{id}", NOT_FOUND, NOT_FOUND)
        with self.assertRaises(KuboError) as cm:
            client_for(self.api).wait("exe_nope")
        self.assertEqual(cm.exception.code, "not_found")
        with self.assertRaises(ValueError):
            client_for(self.api).wait("")

    def test_timeout_while_polling(self):
        self.api.push("GET /v1/executions/{id}", NOT_FOUND, *[(200, {}, RUNNING)] * 100)
        c = client_for(self.api)
        c._sleep = time.sleep
        started = time.monotonic()
        with self.assertRaises(TimeoutError):
            c.wait("exe_1", timeout=0.3)
        self.assertLess(time.monotonic() - started, 5)

    def test_timeout_on_a_silent_stream(self):
        release = threading.Event()
        self.addCleanup(release.set)
        self.api.push("GET /v1/executions/{id}", (200, {}, [STARTED, lambda: release.wait(10), END]))
        started = time.monotonic()
        with self.assertRaises(TimeoutError):
            client_for(self.api).wait("exe_1", timeout=0.3)
        self.assertLess(time.monotonic() - started, 5)


class NetworkTest(AsyncTestCase):
    """submit and batch items carry network as run() does: left out by
    default, [] for none."""

    def test_submit(self):
        client_for(self.api).submit("print(1)", network=["pypi.org"])
        self.assertEqual(json.loads(self.api.requests[-1][3]),
                         {"language": "python", "code": "print(1)", "network": {"allow": ["pypi.org"]}, "async": True})

    def test_batch_items(self):
        client_for(self.api).batch([{"code": "a"}, {"code": "b", "network": []}, {"code": "c", "network": ["pypi.org", "203.0.113.0/24"]}])
        self.assertEqual([e.get("network") for e in json.loads(self.api.requests[-1][3])["executions"]],
                         [None, {"allow": []}, {"allow": ["pypi.org", "203.0.113.0/24"]}])


class BatchTest(AsyncTestCase):
    def test_in_order_with_webhooks(self):
        items = [{"code": "print(1)"},
                 {"code": "echo $1", "language": "bash", "timeout_s": 5, "stdin": "in", "args": ["a"], "env": {"K": "v"},
                  "files": {"d.bin": b"\x00\x01"}, "return_files": ["*.txt"], "webhook_url": "https://own.example.com/"}]
        got = client_for(self.api).batch(items, webhook_url="https://batch.example.com/", idempotency_key="batch-1")
        self.assertEqual(got, [queued("exe_b0", "https://batch.example.com/"), queued("exe_b1", "https://own.example.com/")])
        [(method, path, headers, body)] = self.api.requests
        self.assertEqual((method, path, headers["Idempotency-Key"]), ("POST", "/v1/executions/batch", "batch-1"))
        self.assertEqual(json.loads(body), {"executions": [
            {"language": "python", "code": "print(1)"},
            {"language": "bash", "code": "echo $1", "timeout_s": 5, "stdin": "in", "files": [{"path": "d.bin", "content": "AAE=", "encoding": "base64"}],
             "env": {"K": "v"}, "args": ["a"], "return_files": ["*.txt"], "webhook_url": "https://own.example.com/"}],
            "webhook_url": "https://batch.example.com/"})

    def test_retried_under_the_same_key(self):
        self.api.push("POST /v1/executions/batch", OVERLOADED)
        c = client_for(self.api)
        self.assertEqual(len(c.batch([{"code": "print(1)"}])), 1)
        keys = [h["Idempotency-Key"] for _, _, h, _ in self.api.requests]
        self.assertEqual(len(keys), 2)
        self.assertEqual(keys[0], keys[1])
        self.assertRegex(keys[0], r"^vertal-[0-9a-f]{32}$")

    def test_refusals(self):
        c = client_for(self.api)
        with self.assertRaises(KuboError) as cm:
            c.batch([{"code": "print(1)"}, {"code": "x", "language": "cobol"}])
        self.assertEqual((cm.exception.status, cm.exception.code), (400, "invalid_request"))
        self.assertEqual(cm.exception.message, "executions[1].language: unsupported language 'cobol'")
        with self.assertRaises(KuboError) as cm:
            c.batch([{"code": "print(1)"}] * 21)
        self.assertEqual(cm.exception.status, 400)
        self.api.push("POST /v1/executions/batch", QUOTA)
        with self.assertRaises(KuboError) as cm:
            c.batch([{"code": "print(1)"}])
        self.assertEqual(cm.exception.code, "quota_exceeded")
        self.api.push("POST /v1/executions/batch", (202, {}, {"executions": []}))
        with self.assertRaises(KuboError) as cm:
            c.batch([{"code": "print(1)"}])
        self.assertEqual(cm.exception.code, "invalid_response")
        sent = len(self.api.requests)
        for bad, error in [([], ValueError), ([{"code": "x", "langauge": "bash"}], TypeError), ([{"language": "bash"}], TypeError)]:
            with self.assertRaises(error):
                c.batch(bad)
        self.assertEqual(len(self.api.requests), sent, "a bad item was sent")


if __name__ == "__main__":
    unittest.main()
