"""A scripted stand-in for the Vertal Run API, on a local http.server."""

from __future__ import annotations

import base64
import fnmatch
import json
import struct
import threading
import zlib
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

OK_EXECUTION = {
    "id": "exe_9392448a9b514e3f90193963b7d948d0", "status": "succeeded", "stdout": "42\n", "stderr": "",
    "exit_code": 0, "duration_ms": 265, "truncated": False, "usage": {"sandbox_seconds": 0.265},
    "request_id": "req_be05ea1492f949f8a0617a4f3cd738cc", "image": "datasci", "image_version": "20261201T092047Z-19222",
}

EXECUTIONS = {
    "raise SystemExit(3)": {"id": "exe_2", "status": "failed", "stdout": "", "stderr": "Traceback (most recent call last):\nValueError\n",
                            "exit_code": 3, "duration_ms": 30, "truncated": False, "usage": {"sandbox_seconds": 0.03}, "request_id": "req_2",
                            "image": "default", "image_version": None},
    "import sys; sys.exit(3)": {"id": "exe_4", "status": "failed", "stdout": "", "stderr": "", "exit_code": 3,
                                "duration_ms": 25, "truncated": False, "usage": {"sandbox_seconds": 0.025}, "request_id": "req_4"},
    "while True: pass": {"id": "exe_3", "status": "timed_out", "stdout": "", "stderr": "", "exit_code": 137,
                         "duration_ms": 2000, "truncated": False, "usage": {"sandbox_seconds": 2}, "request_id": "req_3"},
}

# A run with a network: one connection made, one refused (fetchExecution
# in internal/mcpserver/mcpserver_test.go).
FETCH_EXECUTION = {
    "id": "exe_4", "status": "failed", "stdout": "200\n", "stderr": "URLError\n", "exit_code": 1, "duration_ms": 812,
    "truncated": False, "usage": {"sandbox_seconds": 0.812, "network_bytes_in": 5120, "network_bytes_out": 312},
    "request_id": "req_4",
    "network": {"allow": ["pypi.org"], "bytes_in": 5120, "bytes_out": 312, "connections": 1, "refused": 1, "attempts": [
        {"host": "pypi.org", "port": 443, "kind": "tls", "allowed": True, "bytes_out": 312, "bytes_in": 5120},
        {"host": "example.com", "port": 443, "kind": "tls", "allowed": False, "reason": "example.com is not in the allowlist",
         "bytes_out": 0, "bytes_in": 0}]},
}
EXECUTIONS["fetch"] = FETCH_EXECUTION

USAGE = {"tenant": "acme", "plan": "free", "today": {"date": "2025-01-02", "executions": 3, "sandbox_seconds": 2.635},
         "limits": {"executions_per_day": 100, "requests_per_minute": 20, "max_timeout_s": 10, "memory_mb": 256}}

LANGUAGES = {"languages": [{"name": "bash", "version": "5.2.15", "aliases": ["sh"]},
                           {"name": "javascript", "version": "22.23.5", "aliases": ["js"]},
                           {"name": "python", "version": "3.11.2", "aliases": ["py"]}]}

# The images the golden tools list is rendered with (testImages in
# internal/mcpserver/mcpserver_test.go).
IMAGES = {"images": [{"name": "default", "packages": []},
                     {"name": "datasci", "packages": [
                         {"name": "python3-pandas", "version": "1.5.3+dfsg-2", "source": "apt"},
                         {"name": "lodash", "version": "4.17.21", "source": "npm"}]}]}


def queued(execution_id, webhook_url=None):
    """An execution as an async submit (or a batch) answers it."""
    webhook = None
    if webhook_url:
        webhook = {"url": webhook_url, "state": "pending", "attempts": 0, "last_status": None, "last_error": None}
    return {"id": execution_id, "status": "queued", "stdout": "", "stderr": "", "exit_code": 0, "duration_ms": 0,
            "truncated": False, "usage": {"sandbox_seconds": 0}, "request_id": "req_q", "language": "python",
            "files": [], "files_truncated": False, "reason": None, "webhook": webhook}


def tiny_png() -> bytes:
    """A real 1x1 PNG, as a program using only the standard library writes it."""
    def chunk(kind, data):
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", 1, 1, 8, 2, 0, 0, 0))
            + chunk(b"IDAT", zlib.compress(b"\x00\xff\x00\x00")) + chunk(b"IEND", b""))


#: What the program "make()" leaves in its working directory, besides the
#: files it was given; return_files picks from both.
MADE_FILES = {"chart.png": tiny_png(), "data.csv": b"city,temp\nOslo,3\n", "notes.bin": b"\xff\x00\xfe\x01",
              "other.txt": b"not asked for"}


def glob_match(pattern: str, path: str) -> bool:
    """A stand-in for doublestar: * does not cross "/", ** matches any
    number of path parts."""
    def match(pp, parts):
        if not pp:
            return not parts
        if pp[0] == "**":
            return any(match(pp[1:], parts[i:]) for i in range(len(parts) + 1))
        return bool(parts) and fnmatch.fnmatchcase(parts[0], pp[0]) and match(pp[1:], parts[1:])
    return match(pattern.split("/"), path.split("/"))


def returned_files(req):
    """The "files" of the answer to req: the files in the working directory
    that match its return_files, sorted by path, in base64 as the API sends
    them."""
    left = {}
    for f in req.get("files") or []:
        content = f["content"]
        left[f["path"]] = base64.b64decode(content) if f.get("encoding") == "base64" else content.encode()
    if req["code"] == "make()":
        left.update(MADE_FILES)
    globs = req.get("return_files") or []
    return [{"path": path, "size": len(left[path]), "encoding": "base64", "content": base64.b64encode(left[path]).decode()}
            for path in sorted(left) if any(glob_match(g, path) for g in globs)]


def sse_event(event_id, name, data):
    return f"id: {event_id}\nevent: {name}\ndata: {json.dumps(data)}\n\n"


def sse_of(execution):
    """The event stream the API sends for a finished execution."""
    out, err = len(execution["stdout"].encode()), len(execution["stderr"].encode())
    chunks = [sse_event("0-0", "started", {"id": execution["id"], "language": "python"}), ": heartbeat\n\n"]
    if out:
        chunks.append(sse_event(f"{out}-0", "stdout", {"text": execution["stdout"]}))
    if err:
        chunks.append(sse_event(f"{out}-{err}", "stderr", {"text": execution["stderr"]}))
    chunks.append(sse_event("end", "result", execution))
    return chunks


class StubAPI:
    """Start with ``with StubAPI() as api:``; ``api.url`` is the base URL.

    ``api.script[route]`` is a list of (status, headers, body) replies used
    before the defaults, route being "METHOD /v1/...". ``api.requests``
    records (method, path, headers, body) of every request.
    """

    def __init__(self):
        self.script: dict[str, list] = {}
        self.requests: list = []
        self.keys = {"kubo_sk_test"}
        # fallback(method, path, headers, raw_body) answers routes the
        # defaults do not know (None: 404), e.g. sandbox_stub.FakeSandboxes.
        self.fallback = None
        self.lock = threading.Lock()
        stub = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):  # keep test output clean
                pass

            def _serve(self):
                length = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(length) if length else b""
                body = raw.decode("utf-8", "replace")
                status, headers, reply = stub._reply(self.command, self.path, dict(self.headers), body, raw)
                if isinstance(reply, list):  # an event stream: chunks sent one by one
                    self.send_response(status)
                    self.send_header("Content-Type", headers.get("Content-Type", "text/event-stream"))
                    self.send_header("X-Request-ID", "req_stream")
                    self.end_headers()
                    try:
                        for chunk in reply:
                            if callable(chunk):
                                chunk()  # e.g. wait for the test
                                continue
                            self.wfile.write(chunk if isinstance(chunk, bytes) else chunk.encode())
                            self.wfile.flush()
                    except (BrokenPipeError, ConnectionResetError):
                        pass  # the client left, as tests of closing expect
                    return
                data = reply if isinstance(reply, bytes) else json.dumps(reply).encode()
                self.send_response(status)
                self.send_header("Content-Type", headers.pop("Content-Type", "application/json"))
                self.send_header("Content-Length", str(len(data)))
                for k, v in headers.items():
                    self.send_header(k, v)
                self.end_headers()
                self.wfile.write(data)

            do_GET = do_POST = do_PUT = do_DELETE = _serve

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.server.shutdown()
        self.server.server_close()

    def push(self, route: str, *replies):
        with self.lock:
            self.script.setdefault(route, []).extend(replies)

    def _reply(self, method, path, headers, body, raw=b""):
        path = path[len("/api"):] if path.startswith("/api/") else path
        route = f"{method} {path}"
        if method == "GET" and path.startswith("/v1/executions/"):
            route = "GET /v1/executions/{id}"
        with self.lock:
            self.requests.append((method, path, headers, body))
            if self.script.get(route):
                return self.script[route].pop(0)
            key = headers.get("Authorization", "").removeprefix("Bearer ")
            if key not in self.keys:
                return 401, {"X-Request-ID": "req_401"}, {"error": {"code": "unauthorized", "message": "invalid or revoked API key"}, "request_id": "req_401"}
            if route == "POST /v1/executions/batch":
                req = json.loads(body)
                items = req.get("executions") or []
                if not 1 <= len(items) <= 20:
                    return 400, {}, {"error": {"code": "invalid_request", "message": "executions: 1 to 20 items"}, "request_id": "req_bad"}
                for i, item in enumerate(items):
                    if item.get("language") not in ("python", "javascript", "bash"):
                        return 400, {}, {"error": {"code": "invalid_request", "message": f"executions[{i}].language: unsupported language {item.get('language')!r}"}, "request_id": "req_bad"}
                return 202, {}, {"executions": [queued(f"exe_b{i}", item.get("webhook_url") or req.get("webhook_url"))
                                                for i, item in enumerate(items)]}
            if route == "POST /v1/executions":
                req = json.loads(body)
                if req.get("async"):
                    return 202, {"Location": "/v1/executions/exe_q"}, queued("exe_q", req.get("webhook_url"))
                if req.get("timeout_s", 0) > 60:
                    return 400, {}, {"error": {"code": "invalid_timeout", "message": "timeout_s must be between 1 and 60 seconds on plan pro"}, "request_id": "req_bad"}
                if req["code"] == "quota":
                    return 429, {"Retry-After": "3600"}, {"error": {"code": "quota_exceeded", "message": "daily quota of 100 executions reached"}, "request_id": "req_q"}
                if req["code"] in EXECUTIONS:
                    execution = EXECUTIONS[req["code"]]
                elif req["code"] == "print(6*7)":
                    execution = OK_EXECUTION
                else:
                    # Echo the code as stdout so tests can see what was sent.
                    execution = dict(OK_EXECUTION, stdout=req["code"])
                if "return_files" in req:
                    execution = dict(execution, files=returned_files(req), files_truncated=False)
                if headers.get("Accept") == "text/event-stream":
                    return 200, {}, sse_of(execution)
                return 200, {}, execution
            if route == "GET /v1/executions/{id}":
                return 200, {}, dict(OK_EXECUTION, id=path.rsplit("/", 1)[1], language="python", created_at=1700000000)
            if route == "GET /v1/usage":
                return 200, {}, USAGE
            if route == "GET /v1/languages":
                return 200, {}, LANGUAGES
            if route == "POST /v1/keys/rotate":
                self.keys.discard(key)
                self.keys.add("kubo_sk_new")
                return 200, {}, {"api_key": "kubo_sk_new", "key_id": "key_new", "revoked_key_id": "key_old", "plan": "pro"}
            if self.fallback is not None:
                answer = self.fallback(method, path, headers, raw)
                if answer is not None:
                    return answer
            return 404, {}, {"error": {"code": "not_found", "message": "no such route"}, "request_id": "req_404"}
