"""A small in-memory stand-in for the /v1/sandboxes routes, plugged into
StubAPI as its fallback. Answers in the API's wire shapes
(client/wire/sandboxes.go); commands are "echo TEXT" (stdout), "fail N"
(stderr "oops\\n", exit N) and anything else as a background process."""

from __future__ import annotations

import base64
import json
import re
import urllib.parse

from .stub import sse_event

ROOT = "/home/user"


def error(status, code, message):
    return status, {}, {"error": {"code": code, "message": message}, "request_id": "req_sbx"}


class FakeSandboxes:
    def __init__(self, api):
        self.api = api
        self.sandboxes = {}
        self.files = {}  # id -> {abs path: bytes}
        self.dirs = {}   # id -> set of abs dirs
        self.commands = {}  # id -> {pid: command}
        self.stdin = []  # (pid, body)
        self.signals = []
        self.uploads = []  # (path, raw bytes, content type)
        self.idempotency = {}
        self.contexts = {}  # id -> {cid: {"info", "vars", "count"}}
        api.fallback = self.handle

    def record(self, sid):
        return self.sandboxes[sid]

    def handle(self, method, path, headers, raw):
        url = urllib.parse.urlsplit(path)
        query = urllib.parse.parse_qs(url.query)
        parts = url.path.split("/")[1:]  # v1 sandboxes {id} ...
        if parts[:2] != ["v1", "sandboxes"]:
            return None
        headers = {k.lower(): v for k, v in headers.items()}
        body = json.loads(raw) if raw and headers.get("content-type") == "application/json" else None
        if len(parts) == 2:
            return self.collection(method, headers, query, body)
        sid = parts[2]
        if sid not in self.sandboxes:
            return error(404, "not_found", f"no sandbox {sid!r}")
        sbx = self.sandboxes[sid]
        rest = "/".join(parts[3:])
        if rest == "" and method == "GET":
            return 200, {}, sbx
        if rest == "" and method == "DELETE":
            sbx.update(status="ended", reason="killed")
            return 200, {}, sbx
        if sbx["status"] == "ended":
            return error(409, "sandbox_not_running", "the sandbox has ended")
        if rest in ("pause", "resume") and method == "POST":
            sbx["status"] = "paused" if rest == "pause" else "running"
            return 200, {}, sbx
        if rest == "timeout" and method == "POST":
            if body.get("timeout_s", 0) > 3600:
                return error(400, "invalid_timeout", "beyond the plan's maximum lifetime")
            sbx["expires_at"] = f"2026-12-02T16:{body['timeout_s'] // 60:02d}:00Z"
            return 200, {}, sbx
        sbx["status"] = "running"  # any call resumes
        if rest == "commands":
            return self.command(sid, method, headers, body)
        m = re.fullmatch(r"commands/(\d+)/(stdin|signal|events)", rest)
        if m:
            pid = int(m.group(1))
            cmd = self.commands[sid].get(pid)
            if cmd is None:
                return error(404, "not_found", f"no command {pid}")
            if m.group(2) == "events":
                return self.events(cmd, headers.get("last-event-id"))
            if not cmd["running"]:
                return error(409, "process_finished", f"command {pid} has finished")
            if m.group(2) == "stdin":
                self.stdin.append((pid, body))
            else:
                self.signals.append((pid, body["signal"]))
                cmd.update(running=False, exit_code=143, ended_at="2026-12-02T15:01:00Z")
            return 200, {}, {"ok": True, "request_id": "req_ack"}
        if rest.startswith("files"):
            return self.file_op(sid, method, rest, query, headers, body, raw)
        if rest == "run" and method == "POST":
            return self.run_cell(sid, headers, body)
        if rest == "contexts":
            ctxs = self.contexts.setdefault(sid, {})
            if method == "GET":
                return 200, {}, {"contexts": [c["info"] for c in ctxs.values()]}
            if body.get("language") not in ("python", "javascript"):
                return error(400, "unsupported_language", "code contexts run python or javascript")
            return 201, {}, self.new_context(sid, body["language"], False)["info"]
        m = re.fullmatch(r"contexts/(ctx_[0-9a-f]+)(/restart)?", rest)
        if m:
            ctx = self.contexts.get(sid, {}).get(m.group(1))
            if ctx is None:
                return error(404, "not_found", f"no code context {m.group(1)!r}")
            if m.group(2):
                ctx["vars"], ctx["count"] = {}, 0
                return 200, {}, ctx["info"]
            del self.contexts[sid][m.group(1)]
            return 200, {}, {"ok": True, "request_id": "req_ack"}
        return None

    def new_context(self, sid, language, default):
        ctxs = self.contexts.setdefault(sid, {})
        cid = "ctx_%032x" % (len(ctxs) + 1)
        ctxs[cid] = {"info": {"id": cid, "language": language, "cwd": ROOT, "default": default,
                              "created_at": "2026-12-02T15:00:00Z"}, "vars": {}, "count": 0}
        return ctxs[cid]

    def run_cell(self, sid, headers, body):
        """A cell: "NAME = VALUE" sets, "print(TEXT)" prints, "raise NAME"
        fails, anything else is the value of that name (or the text)."""
        ctxs = self.contexts.setdefault(sid, {})
        if body.get("context_id"):
            ctx = ctxs.get(body["context_id"])
            if ctx is None:
                return error(404, "not_found", "no code context")
        else:
            lang = body.get("language") or "python"
            ctx = next((c for c in ctxs.values() if c["info"]["default"] and c["info"]["language"] == lang), None)
            ctx = ctx or self.new_context(sid, lang, True)
        ctx["count"] += 1
        code = body["code"].strip()
        res = {"context_id": ctx["info"]["id"], "status": "succeeded", "stdout": "", "stderr": "", "results": [],
               "error": None, "execution_count": ctx["count"], "duration_ms": 2, "truncated": False,
               "usage": {"cpu_seconds": 0.0}, "request_id": "req_cell"}
        events = []
        name, sep, value = code.partition(" = ")
        if sep:
            ctx["vars"][name] = value
        elif code.startswith("print(") and code.endswith(")"):
            res["stdout"] = code[6:-1] + "\n"
            events.append(sse_event("1", "stdout", {"text": res["stdout"]}))
        elif code.startswith("raise "):
            res["status"] = "failed"
            res["error"] = {"name": code[6:], "value": "boom", "traceback": "Traceback (most recent call last):\n"}
            events.append(sse_event("1", "error", res["error"]))
        else:
            out = {"main": True, "data": {"text/plain": ctx["vars"].get(code, code)}}
            res["results"].append(out)
            events.append(sse_event("1", "result", out))
        if headers.get("accept") == "text/event-stream":
            events.append(sse_event("end", "end", res))
            return 200, {}, events
        return 200, {}, res

    def collection(self, method, headers, query, body):
        if method == "POST":
            key = headers.get("idempotency-key")
            if key in self.idempotency:
                return 201, {}, self.sandboxes[self.idempotency[key]]
            if body.get("image") == "missing":
                return error(400, "invalid_request", "no image 'missing'")
            sid = "sbx_%032x" % (len(self.sandboxes) + 1)
            self.idempotency[key] = sid
            self.sandboxes[sid] = {
                "id": sid, "status": "running", "reason": None, "message": None, "image": body.get("image", "default"),
                "image_version": "v1", "created_at": "2026-12-02T15:00:00Z", "expires_at": "2026-12-02T15:05:00Z",
                "ended_at": None, "on_timeout": body.get("on_timeout", "kill"),
                "limits": {"memory_mb": 256, "cpus": 1, "pids": 128, "home_mb": 64, "tmp_mb": 64, "output_bytes": 65536,
                           "max_lifetime_s": 3600, "max_file_mb": 10, "file_size_bytes": 10 << 20},
                "metadata": body.get("metadata") or {}, "alive_seconds": 0, "cpu_seconds": 0, "request_id": "req_c",
            }
            files = {}
            for f in body.get("files") or []:
                content = base64.b64decode(f["content"]) if f.get("encoding") == "base64" else f["content"].encode()
                files[ROOT + "/" + f["path"]] = content
            self.files[sid], self.dirs[sid], self.commands[sid] = files, {ROOT}, {}
            return 201, {"Location": "/v1/sandboxes/" + sid}, self.sandboxes[sid]
        if method == "GET":
            items = sorted(self.sandboxes.values(), key=lambda s: s["id"], reverse=True)
            if "status" in query:
                items = [s for s in items if s["status"] == query["status"][0]]
            for k, v in query.items():
                if k.startswith("metadata."):
                    items = [s for s in items if s["metadata"].get(k[len("metadata."):]) == v[0]]
            start = int(query.get("cursor", ["0"])[0])
            limit = int(query.get("limit", ["50"])[0])
            page = items[start:start + limit]
            more = start + limit < len(items)
            return 200, {}, {"sandboxes": page, "next_cursor": str(start + limit) if more else None}
        return None

    def command(self, sid, method, headers, body):
        cmds = self.commands[sid]
        if method == "GET":
            return 200, {}, {"commands": list(cmds.values())}
        pid = 100 + len(cmds)
        line = body.get("cmd") or " ".join(body.get("argv") or [])
        if body.get("background"):
            cmds[pid] = {"pid": pid, "cmd": body.get("cmd"), "argv": body.get("argv") or [], "running": True,
                         "exit_code": None, "started_at": "2026-12-02T15:00:00Z", "ended_at": None}
            return 201, {}, cmds[pid]
        stdout = stderr = ""
        code = 0
        if line.startswith("echo "):
            stdout = line[5:] + "\n"
        elif line.startswith("fail "):
            stderr, code = "oops\n", int(line[5:])
        if body.get("stdin"):
            stdout += body["stdin"]
        result = {"pid": pid, "status": "succeeded" if code == 0 else "failed", "stdout": stdout, "stderr": stderr,
                  "exit_code": code, "duration_ms": 3, "truncated": False, "usage": {"cpu_seconds": 0.001},
                  "request_id": "req_cmd"}
        cmds[pid] = {"pid": pid, "cmd": body.get("cmd"), "argv": body.get("argv") or [], "running": False,
                     "exit_code": code, "started_at": "2026-12-02T15:00:00Z", "ended_at": "2026-12-02T15:00:01Z"}
        if headers.get("accept") == "text/event-stream":
            chunks = [": heartbeat\n\n"]
            seq = 0
            for name, text in (("stdout", stdout), ("stderr", stderr)):
                for piece in text.splitlines(keepends=True):
                    seq += 1
                    chunks.append(sse_event(str(seq), name, {"text": piece}))
            chunks.append(sse_event("end", "result", result))
            return 200, {}, chunks
        return 200, {}, result

    def events(self, cmd, last_id):
        evs = [("stdout", {"text": "one\n"}), ("stderr", {"text": "two\n"}), ("stdout", {"text": "three\n"}),
               ("exit", {"exit_code": 0})]
        after = int(last_id) if last_id and last_id.isdigit() else 0
        return 200, {}, [sse_event(str(i), name, data) for i, (name, data) in enumerate(evs, 1) if i > after]

    def file_op(self, sid, method, rest, query, headers, body, raw):
        files, dirs = self.files[sid], self.dirs[sid]

        def absolute(p):
            return p if p.startswith("/") else ROOT + "/" + p

        def entry(p):
            is_dir = p in dirs
            return {"name": p.rsplit("/", 1)[1], "path": p, "type": "dir" if is_dir else "file",
                    "size": 0 if is_dir else len(files[p]), "mode": "0755" if is_dir else "0644",
                    "mtime": "2026-12-02T15:00:00Z"}

        if rest == "files/mkdir":
            p = absolute(body["path"])
            dirs.add(p)
            return 201, {}, entry(p)
        if rest == "files/move":
            src, dst = absolute(body["from"]), absolute(body["to"])
            if src not in files:
                return error(404, "not_found", f"no file {src}")
            files[dst] = files.pop(src)
            return 200, {}, entry(dst)
        p = absolute(query["path"][0])
        if p.startswith("/etc"):
            return error(403, "forbidden", "the root filesystem is read-only")
        if method == "PUT":
            if len(raw) > 10 << 20:
                return error(413, "payload_too_large", "over max_file_mb")
            self.uploads.append((p, raw, headers.get("content-type")))
            files[p] = raw
            parent = p.rsplit("/", 1)[0]
            while parent.startswith(ROOT):
                dirs.add(parent)
                parent = parent.rsplit("/", 1)[0]
            return 200, {}, entry(p)
        if method == "DELETE":
            if p not in files and p not in dirs:
                return error(404, "not_found", f"no file {p}")
            for f in [f for f in files if f == p or f.startswith(p + "/")]:
                del files[f]
            dirs.discard(p)
            return 200, {}, {"ok": True, "request_id": "req_ack"}
        if p in dirs:
            names = sorted({f for f in list(files) + list(dirs) if f.rsplit("/", 1)[0] == p})
            return 200, {}, {"path": p, "entries": [entry(f) for f in names]}
        if p in files:
            return 200, {"Content-Type": "application/octet-stream"}, files[p]
        return error(404, "not_found", f"no file {p}")
