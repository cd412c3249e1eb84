"""Unit tests of vertal2kubo.client against a local stub of the API."""

import json
import os
import unittest
from unittest import mock

from vertal2kubo.client import DEFAULT_URL, KuboClient, KuboError

from .stub import FETCH_EXECUTION, OK_EXECUTION, StubAPI

OVERLOADED = (503, {"Retry-After": "2"}, {"error": {"code": "overloaded", "message": "all sandboxes are busy"}, "request_id": "req_a"})
RATE_LIMITED = (429, {"Retry-After": "7"}, {"error": {"code": "rate_limited", "message": "120 requests per minute"}, "request_id": "req_c"})
QUOTA = (429, {"Retry-After": "3"}, {"error": {"code": "quota_exceeded", "message": "daily quota of 100 executions reached"}, "request_id": "req_d"})
LONG_WAIT = (503, {"Retry-After": "3600"}, {"error": {"code": "overloaded", "message": "busy"}, "request_id": "req_e"})
NO_HINT = (503, {}, {"error": {"code": "overloaded", "message": "busy"}, "request_id": "req_f"})


def client_for(api, suffix="", **kw):
    c = KuboClient(api.url + suffix, "kubo_sk_test", **kw)
    c.slept = []
    c._sleep = c.slept.append
    return c


class RunTest(unittest.TestCase):
    def setUp(self):
        self.api = StubAPI().__enter__()
        self.addCleanup(self.api.__exit__)

    def test_documented_request(self):
        for suffix in ("", "/api", "/api/"):
            with self.subTest(suffix=suffix):
                self.api.requests.clear()
                result = client_for(self.api, suffix).run("print(6*7)")
                self.assertEqual(result, OK_EXECUTION)
                [(method, path, headers, body)] = self.api.requests
                self.assertEqual((method, path), ("POST", "/v1/executions"))
                self.assertEqual(json.loads(body), {"language": "python", "code": "print(6*7)"})
                self.assertEqual(headers["Authorization"], "Bearer kubo_sk_test")
                self.assertEqual(headers["Content-Type"], "application/json")
                key = headers["Idempotency-Key"]
                self.assertRegex(key, r"^vertal-[0-9a-f]{32}$")

    def test_options(self):
        client_for(self.api).run("cat", language="bash", timeout_s=5, idempotency_key="order-1234", stdin="hi\n")
        [(_, _, headers, body)] = self.api.requests
        self.assertEqual(headers["Idempotency-Key"], "order-1234")
        self.assertEqual(json.loads(body), {"language": "bash", "code": "cat", "timeout_s": 5, "stdin": "hi\n"})

    def test_network(self):
        c = client_for(self.api)

        def sent():
            return json.loads(self.api.requests[-1][3])
        result = c.run("fetch", network=["pypi.org", "*.pythonhosted.org"])
        self.assertEqual(sent()["network"], {"allow": ["pypi.org", "*.pythonhosted.org"]})
        # What it reached and what was refused, as the API gave it.
        self.assertEqual(result["network"], FETCH_EXECUTION["network"])
        self.assertEqual((result["usage"]["network_bytes_in"], result["usage"]["network_bytes_out"]), (5120, 312))
        [event] = [e for e in c.stream("fetch", network=("pypi.org",)) if e["type"] == "result"]
        self.assertEqual(sent()["network"], {"allow": ["pypi.org"]})
        self.assertEqual(event["execution"]["network"], FETCH_EXECUTION["network"])
        c.run("print(1)", network=[])
        self.assertEqual(sent()["network"], {"allow": []})
        result = c.run("print(6*7)")
        self.assertNotIn("network", sent())
        self.assertNotIn("network", result)
        self.assertNotIn("network_bytes_in", result["usage"])
        n = len(self.api.requests)
        with self.assertRaises(TypeError):
            c.run("print(1)", network="pypi.org")
        self.assertEqual(len(self.api.requests), n, "a bad network was sent")

    def test_generated_keys_differ(self):
        c = client_for(self.api)
        c.run("print(1)")
        c.run("print(1)")
        keys = [r[2]["Idempotency-Key"] for r in self.api.requests]
        self.assertNotEqual(keys[0], keys[1])

    def test_retries(self):
        cases = [
            ("503 honours Retry-After", [OVERLOADED], [2.0], None, 2),
            ("429 rate_limited honours Retry-After", [RATE_LIMITED, RATE_LIMITED], [7.0, 7.0], None, 3),
            ("gives up after max retries", [OVERLOADED] * 5, [2.0] * 3, "overloaded", 4),
            ("quota_exceeded is not retried", [QUOTA], [], "quota_exceeded", 1),
            ("409 idempotency_in_progress is retried", [(409, {"Retry-After": "1"}, {"error": {"code": "idempotency_in_progress", "message": "still running"}, "request_id": "req_i"})],
             [1.0], None, 2),
            ("409 idempotency_conflict is not retried", [(409, {}, {"error": {"code": "idempotency_conflict", "message": "different body"}, "request_id": "req_j"})],
             [], "idempotency_conflict", 1),
            ("Retry-After over the cap is raised at once", [LONG_WAIT], [], "overloaded", 1),
        ]
        for name, script, want_sleeps, want_code, want_tries in cases:
            with self.subTest(name):
                self.api.requests.clear()
                self.api.script.clear()
                self.api.push("POST /v1/executions", *script)
                c = client_for(self.api)
                code = None
                try:
                    c.run("print(1)")
                except KuboError as e:
                    code = e.code
                self.assertEqual(code, want_code)
                self.assertEqual(c.slept, want_sleeps)
                self.assertEqual(len(self.api.requests), want_tries)
                # Every attempt carries the same key and body: the server can
                # recognise the retry and never runs the code twice.
                self.assertEqual(len({(r[2]["Idempotency-Key"], r[3]) for r in self.api.requests}), 1)

    def test_backoff_without_retry_after(self):
        self.api.push("POST /v1/executions", NO_HINT, NO_HINT)
        c = client_for(self.api)
        c.run("print(1)")
        self.assertEqual(len(c.slept), 2)
        for i, d in enumerate(c.slept):
            lo = 0.5 * 2 ** i
            self.assertTrue(lo <= d <= lo * 1.25, f"backoff {i} = {d}")

    def test_rotate_is_not_retried_on_503_but_on_429(self):
        self.api.push("POST /v1/keys/rotate", OVERLOADED)
        c = client_for(self.api)
        with self.assertRaises(KuboError) as cm:
            c.rotate_key()
        self.assertEqual(cm.exception.code, "overloaded")
        self.assertEqual(len(self.api.requests), 1)
        self.api.push("POST /v1/keys/rotate", RATE_LIMITED)
        c.rotate_key()
        self.assertEqual(c.slept, [7.0])

    def test_connection_failure(self):
        c = KuboClient("http://127.0.0.1:1", "kubo_sk_test")
        c.slept = []
        c._sleep = c.slept.append
        with self.assertRaises(KuboError) as cm:
            c.usage()
        self.assertEqual((cm.exception.status, cm.exception.code), (0, "connection_failed"))
        self.assertEqual(len(c.slept), 3, "idempotent calls are retried after a lost connection")
        c.slept.clear()
        with self.assertRaises(KuboError):
            c.rotate_key()
        self.assertEqual(c.slept, [], "rotate is never sent twice")


class ErrorTest(unittest.TestCase):
    def test_error_fields(self):
        cases = [
            ((400, {}, {"error": {"code": "invalid_timeout", "message": "timeout_s must be between 1 and 60"}, "request_id": "req_x"}),
             (400, "invalid_timeout", "timeout_s must be between 1 and 60", "req_x", None)),
            (QUOTA, (429, "quota_exceeded", "daily quota of 100 executions reached", "req_d", 3.0)),
            ((502, {"X-Request-ID": "req_h"}, b"<html>bad gateway</html>"), (502, "http_502", "Bad Gateway", "req_h", None)),
        ]
        with StubAPI() as api:
            for reply, want in cases:
                with self.subTest(want[1]):
                    api.push("POST /v1/executions", reply)
                    with self.assertRaises(KuboError) as cm:
                        client_for(api, max_retries=0).run("x")
                    e = cm.exception
                    self.assertEqual((e.status, e.code, e.message, e.request_id, e.retry_after), want)
                    self.assertIn(want[1], str(e))
                    if want[3]:
                        self.assertIn(want[3], str(e))

    def test_unauthorized(self):
        with StubAPI() as api:
            with self.assertRaises(KuboError) as cm:
                KuboClient(api.url, "kubo_sk_wrong").usage()
            self.assertEqual((cm.exception.status, cm.exception.code, cm.exception.request_id), (401, "unauthorized", "req_401"))


class CallsTest(unittest.TestCase):
    def test_get_usage_languages_rotate(self):
        with StubAPI() as api:
            c = client_for(api, "/api")
            self.assertEqual(c.get("exe_1")["created_at"], 1700000000)
            self.assertEqual(c.usage()["limits"]["max_timeout_s"], 10)
            self.assertEqual([l["name"] for l in c.languages()], ["bash", "javascript", "python"])
            rotated = c.rotate_key()
            self.assertEqual(rotated, {"api_key": "kubo_sk_new", "key_id": "key_new", "revoked_key_id": "key_old", "plan": "pro"})
            self.assertEqual(c.api_key, "kubo_sk_new")
            c.usage()
            self.assertEqual(api.requests[-1][2]["Authorization"], "Bearer kubo_sk_new")
            with self.assertRaises(KuboError) as cm:
                KuboClient(api.url, "kubo_sk_test").usage()
            self.assertEqual(cm.exception.code, "unauthorized")

    def test_repr_hides_key(self):
        self.assertNotIn("kubo_sk", repr(KuboClient("http://x", "kubo_sk_secret")))


class ConfigTest(unittest.TestCase):
    def test_environment(self):
        with mock.patch.dict(os.environ, {"KUBO_API_URL": "http://127.0.0.1:9/api/", "KUBO_API_KEY": "kubo_sk_env"}):
            c = KuboClient()
            self.assertEqual((c.url, c.api_key), ("http://127.0.0.1:9/api", "kubo_sk_env"))
            self.assertEqual(KuboClient("http://h", "kubo_sk_arg").api_key, "kubo_sk_arg")
        with mock.patch.dict(os.environ, {"KUBO_API_KEY": "kubo_sk_env"}, clear=True):
            self.assertEqual(KuboClient().url, DEFAULT_URL)
        with mock.patch.dict(os.environ, {}, clear=True):
            with self.assertRaisesRegex(ValueError, "KUBO_API_KEY"):
                KuboClient("http://h")

    def test_bad_url(self):
        for url in ("vertalrun.com/api", "ftp://x", "http://", "http://x/api?k=1"):
            with self.subTest(url), self.assertRaises(ValueError):
                KuboClient(url, "k")


if __name__ == "__main__":
    unittest.main()
