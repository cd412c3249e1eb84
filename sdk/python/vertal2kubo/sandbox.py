"""Sandboxes that stay: one sandbox across many calls, with commands,
files, pause and resume (the /v1/sandboxes routes). Standard library only.

    from vertal2kubo import KuboClient

    client = KuboClient()
    sbx = client.create_sandbox(timeout_s=600, metadata={"job": "csv"})
    sbx.files.write("/home/user/data.csv", b"a,b\\n1,2\\n")
    print(sbx.commands.run("wc -l data.csv")["stdout"])
    for event in sbx.commands.stream("for i in 1 2 3; do echo $i; sleep 1; done"):
        if event["type"] == "stdout":
            print(event["text"], end="")
    sbx.run_code("import statistics; xs = [3, 1, 4]")   # a code context keeps state
    print(sbx.run_code("statistics.mean(xs)")["results"][0]["data"]["text/plain"])
    sbx.pause()       # files under /home/user are kept; processes (and code contexts) are not
    sbx.resume()
    sbx.kill()

Every answer of the API is a dict as it arrives (parsed in one place,
``_Wire`` below); a refusal raises ``KuboError`` with the API's code, e.g.
``not_found``, ``sandbox_not_running``, ``process_finished``,
``sandbox_limit`` or ``payload_too_large``.
"""

from __future__ import annotations

import http.client
import json
import urllib.parse
import uuid
from typing import TYPE_CHECKING, Any, Iterable, Iterator, Mapping, Optional, Sequence

from .client import _EVENT_STREAM, _MAX_RESPONSE_BYTES, Files, KuboError, _encode_files, _encode_network, _SSEParser

if TYPE_CHECKING:
    from .client import KuboClient

__all__ = ["Sandbox", "Commands", "SandboxFiles", "Contexts"]

_BASE = "/v1/sandboxes"
# The events a command's stream carries; others (from a newer server) are skipped.
_COMMAND_EVENTS = ("stdout", "stderr", "exit", "result", "error")
# The events of a cell's stream (POST .../run).
_CODE_EVENTS = ("stdout", "stderr", "result", "error", "end")


def _payload(name: str, data: str) -> dict:
    """The JSON object an event carries; KuboError if it is none."""
    try:
        payload = json.loads(data)
    except ValueError:
        raise KuboError(0, "invalid_response", f"the {name} event is not JSON") from None
    if not isinstance(payload, dict):
        raise KuboError(0, "invalid_response", f"the {name} event is not an object")
    return payload


class _Wire:
    """What the SDK reads of the API's answers, in one place."""

    @staticmethod
    def sandbox(body: Any) -> dict:
        if not isinstance(body, dict) or not body.get("id"):
            raise KuboError(0, "invalid_response", "the answer carries no sandbox id")
        return body

    @staticmethod
    def _items(body: Any, key: str) -> list:
        """body[key], a list (or body itself when a server answers a bare list)."""
        items = body.get(key) if isinstance(body, dict) else body
        if not isinstance(items, list):
            raise KuboError(0, "invalid_response", f"the answer carries no {key}")
        return items

    @staticmethod
    def sandbox_list(body: Any) -> tuple:
        if not isinstance(body, dict):
            raise KuboError(0, "invalid_response", "the sandbox list is not an object")
        return _Wire._items(body, "sandboxes"), body.get("next_cursor") or None

    @staticmethod
    def command(body: Any) -> dict:
        if not isinstance(body, dict) or not isinstance(body.get("pid"), int):
            raise KuboError(0, "invalid_response", "the started command carries no pid")
        return body

    @staticmethod
    def commands(body: Any) -> list:
        return _Wire._items(body, "commands")

    @staticmethod
    def entries(body: Any) -> list:
        return _Wire._items(body, "entries")

    @staticmethod
    def event(sse_id: str, name: str, data: str, request_id: Optional[str]) -> Optional[dict]:
        """One server-sent event of a command as a dict: stdout/stderr
        with "text", exit with "exit_code", result with "result" (the
        CommandResult). An error event raises KuboError; an unknown one is
        None."""
        if name not in _COMMAND_EVENTS:
            return None
        payload = _payload(name, data)
        event: dict[str, Any] = {"type": name, "id": sse_id}
        if name in ("stdout", "stderr"):
            # {"text"} as an execution's output; {"data"} as the contract names it.
            text = payload.get("text")
            event["text"] = text if text is not None else payload.get("data", "")
        elif name == "exit":
            event["exit_code"] = payload.get("exit_code")
        elif name == "result":
            event["result"] = payload
        else:
            err = payload.get("error") or {}
            raise KuboError(0, err.get("code") or "stream_error", err.get("message", ""),
                            payload.get("request_id") or request_id)
        return event


    @staticmethod
    def code_event(sse_id: str, name: str, data: str, request_id: Optional[str]) -> Optional[dict]:
        """One server-sent event of a cell as a dict: stdout/stderr with
        "text", result with "result" (a MIME bundle: main, data), error
        with "error" (name, value, traceback: what the cell raised), end
        with "result" (the whole outcome). The platform's failure (an
        error event with id "end") raises KuboError; an unknown event is
        None."""
        if name not in _CODE_EVENTS:
            return None
        payload = _payload(name, data)
        event: dict[str, Any] = {"type": name, "id": sse_id}
        if name in ("stdout", "stderr"):
            event["text"] = payload.get("text", "")
        elif name in ("result", "end"):
            event["result"] = payload
        elif sse_id == "end":
            err = payload.get("error") or {}
            raise KuboError(0, err.get("code") or "stream_error", err.get("message", ""),
                            payload.get("request_id") or request_id)
        else:
            event["error"] = payload
        return event


def _quote(part: Any) -> str:
    return urllib.parse.quote(str(part), safe="")


class Sandbox:
    """One sandbox. ``info`` is its last known record (id, status,
    reason, message, image, image_version, created_at, expires_at,
    ended_at, on_timeout, limits, metadata, alive_seconds, cpu_seconds);
    every call that answers the sandbox updates it. ``commands`` and
    ``files`` work inside it."""

    def __init__(self, client: "KuboClient", info: dict):
        self._client = client
        self.info = _Wire.sandbox(info)
        self.id: str = info["id"]
        self.commands = Commands(self)
        self.files = SandboxFiles(self)
        self.contexts = Contexts(self)

    def __repr__(self) -> str:
        return f"Sandbox({self.id!r}, status={self.status!r})"

    @property
    def status(self) -> str:
        """running, paused or ended (as last seen; refresh() asks again)."""
        return self.info.get("status", "")

    def _path(self, rest: str = "") -> str:
        return f"{_BASE}/{_quote(self.id)}{rest}"

    def _update(self, body: Any) -> "Sandbox":
        self.info = _Wire.sandbox(body)
        return self

    def refresh(self) -> "Sandbox":
        """GET the sandbox again; returns self."""
        return self._update(self._client._call("GET", self._path(), retry="always"))

    def kill(self) -> "Sandbox":
        """End it (reason killed); its record stays readable."""
        return self._update(self._client._call("DELETE", self._path(), retry="always"))

    def pause(self) -> "Sandbox":
        """Stop its processes and keep its files; any later call resumes it."""
        return self._update(self._client._call("POST", self._path("/pause"), {}, retry="always"))

    def resume(self) -> "Sandbox":
        return self._update(self._client._call("POST", self._path("/resume"), {}, retry="always"))

    def set_timeout(self, timeout_s: int) -> "Sandbox":
        """Make it expire timeout_s seconds from now (up to the plan's lifetime)."""
        return self._update(self._client._call("POST", self._path("/timeout"), {"timeout_s": timeout_s},
                                               retry="always"))


    @staticmethod
    def _code_body(code, context_id, language, env, timeout_s) -> dict:
        if not isinstance(code, str):
            raise TypeError("code must be a str")
        body: dict[str, Any] = {"code": code}
        if context_id:
            body["context_id"] = context_id
        if language:
            body["language"] = language
        if env:
            body["env"] = dict(env)
        if timeout_s is not None:
            body["timeout_s"] = timeout_s
        return body

    def run_code(self, code: str, *, context_id: Optional[str] = None, language: Optional[str] = None,
                 env: Optional[Mapping[str, str]] = None, timeout_s: Optional[int] = None) -> dict:
        """Run one cell in a code context, an interpreter in the sandbox
        that keeps its variables, imports and open files between cells:
        context_id, or else the default context of language (python
        unless given; or javascript). Returns context_id, status
        (succeeded, failed, timed_out), stdout, stderr, results (MIME
        bundles: {"main", "data": {"text/plain", "text/html",
        "image/png" (base64), ...}}), error ({name, value, traceback} or
        None), execution_count, duration_ms, truncated, usage. A cell that
        raises or times out is a normal result; a timeout interrupts it
        and keeps the context."""
        body = self._code_body(code, context_id, language, env, timeout_s)
        c = self._client
        wait = c.timeout if c.timeout is not None else float(timeout_s or 60) + 120.0
        # Not idempotent: only a 429 (refused before anything ran) is retried.
        return c._call("POST", self._path("/run"), body, retry="rate_limit_only", timeout=wait)

    def stream_code(self, code: str, *, context_id: Optional[str] = None, language: Optional[str] = None,
                    env: Optional[Mapping[str, str]] = None, timeout_s: Optional[int] = None) -> Iterator[dict]:
        """Run a cell like run_code(), yielding its events as they come:
        ``{"type": "stdout"|"stderr", "text"}``, ``{"type": "result",
        "result"}`` (a MIME bundle), ``{"type": "error", "error"}`` (what
        the cell raised), then last ``{"type": "end", "result"}`` with what
        run_code() returns. The platform's failure raises KuboError; a lost
        connection raises connection_failed (the cell is not run twice)."""
        body = self._code_body(code, context_id, language, env, timeout_s)
        c = self._client
        data = json.dumps(body).encode("utf-8")
        wait = c.timeout if c.timeout is not None else float(timeout_s or 60) + 120.0

        def events() -> Iterator[dict]:
            resp = c._with_retries(lambda: c._open("POST", self._path("/run"), data, {}, wait, _EVENT_STREAM),
                                   "rate_limit_only")
            try:
                for event in _read_sse(resp, "", _Wire.code_event):
                    yield event
                    if event["type"] == "end":
                        return
            except (OSError, http.client.HTTPException) as err:
                raise KuboError(0, "connection_failed", f"reading the cell's stream: {err}") from err
            finally:
                resp.close()
            raise KuboError(0, "connection_failed", "the cell's stream ended before its outcome")
        return events()


class Contexts:
    """The code contexts of a sandbox: ``create``, ``list``, ``restart``
    and ``delete``. Cells run in them with ``Sandbox.run_code``."""

    def __init__(self, sandbox: Sandbox):
        self._sbx = sandbox

    def create(self, language: str = "python", cwd: Optional[str] = None) -> dict:
        """Start an interpreter (python or javascript); returns the
        context: id (ctx_...), language, cwd, default, created_at."""
        body: dict[str, Any] = {"language": language}
        if cwd:
            body["cwd"] = cwd
        return self._sbx._client._call("POST", self._sbx._path("/contexts"), body, retry="rate_limit_only")

    def list(self) -> list:
        return _Wire._items(self._sbx._client._call("GET", self._sbx._path("/contexts"), retry="always"), "contexts")

    def restart(self, context_id: str) -> dict:
        """Start the context's interpreter afresh, without its state."""
        return self._sbx._client._call("POST", self._sbx._path(f"/contexts/{_quote(context_id)}/restart"), {},
                                       retry="rate_limit_only")

    def delete(self, context_id: str) -> None:
        self._sbx._client._call("DELETE", self._sbx._path(f"/contexts/{_quote(context_id)}"), retry="always")


class Commands:
    """Commands inside a sandbox: ``run`` (foreground), ``stream``
    (foreground, yielding output), ``start`` (background), ``list``,
    ``send_stdin``, ``signal`` and ``events`` (attach)."""

    def __init__(self, sandbox: Sandbox):
        self._sbx = sandbox

    @staticmethod
    def _body(cmd, argv, cwd, env, stdin, timeout_s, background=False) -> dict:
        if (cmd is None) == (argv is None):
            raise TypeError("give exactly one of cmd (a shell line) and argv")
        body: dict[str, Any] = {"cmd": cmd} if cmd is not None else {"argv": list(argv)}
        if cwd:
            body["cwd"] = cwd
        if env:
            body["env"] = dict(env)
        if stdin is not None and stdin != "":
            body["stdin"] = stdin
        if timeout_s is not None:
            body["timeout_s"] = timeout_s
        if background:
            body["background"] = True
        return body

    def run(self, cmd: Optional[str] = None, *, argv: Optional[Iterable[str]] = None, cwd: Optional[str] = None,
            env: Optional[Mapping[str, str]] = None, stdin: Optional[str] = None,
            timeout_s: Optional[int] = None) -> dict:
        """Run a command and wait: cmd is a shell line (/bin/sh -c), or
        give argv. Returns pid, status (succeeded, failed, timed_out,
        memory_exceeded), stdout, stderr, exit_code, duration_ms,
        truncated, usage. A failing command is a normal result."""
        body = self._body(cmd, argv, cwd, env, stdin, timeout_s)
        c = self._sbx._client
        wait = c.timeout if c.timeout is not None else float(timeout_s or 60) + 120.0
        # Not idempotent: only a 429 (refused before anything ran) is retried.
        return c._call("POST", self._sbx._path("/commands"), body, retry="rate_limit_only", timeout=wait)

    def stream(self, cmd: Optional[str] = None, *, argv: Optional[Iterable[str]] = None, cwd: Optional[str] = None,
               env: Optional[Mapping[str, str]] = None, stdin: Optional[str] = None,
               timeout_s: Optional[int] = None) -> Iterator[dict]:
        """Run a command like run(), yielding its events while it runs:
        ``{"type": "stdout"|"stderr", "id", "text"}``, then last
        ``{"type": "result", "id", "result"}`` with what run() returns.
        A refusal raises KuboError; a failure after the start raises
        KuboError with status 0. A lost connection is not retried (the
        command is not run twice): it raises connection_failed. A server
        that answers JSON gives the same events."""
        body = self._body(cmd, argv, cwd, env, stdin, timeout_s)
        c = self._sbx._client
        data = json.dumps(body).encode("utf-8")
        wait = c.timeout if c.timeout is not None else float(timeout_s or 60) + 120.0

        def events() -> Iterator[dict]:
            resp = c._with_retries(lambda: c._open("POST", self._sbx._path("/commands"), data, {}, wait,
                                                   _EVENT_STREAM), "rate_limit_only")
            try:
                ctype = _content_type(resp)
                if ctype == "application/json":
                    result = json.loads(resp.read(_MAX_RESPONSE_BYTES))
                    for name in ("stdout", "stderr"):
                        if result.get(name):
                            yield {"type": name, "id": "", "text": result[name]}
                    yield {"type": "result", "id": "end", "result": result}
                    return
                for event in _read_sse(resp, ""):
                    yield event
                    if event["type"] == "result":
                        return
            except (OSError, http.client.HTTPException) as err:
                raise KuboError(0, "connection_failed", f"reading the command's stream: {err}") from err
            finally:
                resp.close()
            raise KuboError(0, "connection_failed", "the command's stream ended before its result")
        return events()

    def start(self, cmd: Optional[str] = None, *, argv: Optional[Iterable[str]] = None, cwd: Optional[str] = None,
              env: Optional[Mapping[str, str]] = None, stdin: Optional[str] = None,
              timeout_s: Optional[int] = None) -> dict:
        """Start a background command and return at once with it: pid,
        cmd, argv, running, started_at. Without stdin its input stays open
        for send_stdin()."""
        body = self._body(cmd, argv, cwd, env, stdin, timeout_s, background=True)
        return _Wire.command(self._sbx._client._call("POST", self._sbx._path("/commands"), body,
                                                      retry="rate_limit_only"))

    def list(self) -> list:
        """The sandbox's commands: pid, cmd, argv, running, exit_code, started_at, ended_at."""
        return _Wire.commands(self._sbx._client._call("GET", self._sbx._path("/commands"), retry="always"))

    def send_stdin(self, pid: int, data: Optional[str] = None, eof: bool = False) -> None:
        """Write data to a background command's stdin; eof closes it."""
        body: dict[str, Any] = {}
        if data is not None:
            body["data"] = data
        if eof:
            body["eof"] = True
        if not body:
            raise ValueError("give data, eof or both")
        self._sbx._client._call("POST", self._sbx._path(f"/commands/{_quote(pid)}/stdin"), body,
                                retry="rate_limit_only")

    def signal(self, pid: int, signal: str = "TERM") -> None:
        """Send a signal by name: TERM, KILL, INT, HUP, QUIT, USR1, USR2, STOP, CONT."""
        self._sbx._client._call("POST", self._sbx._path(f"/commands/{_quote(pid)}/signal"),
                                {"signal": signal}, retry="always")

    def events(self, pid: int, last_event_id: Optional[str] = None) -> Iterator[dict]:
        """Attach to a command: yield its events (stdout/stderr with
        "text", then ``{"type": "exit", "exit_code"}``), replayed from the
        start or after last_event_id (an event's "id"). A dropped
        connection is resumed after the last event seen, so nothing is
        lost or repeated."""
        c = self._sbx._client
        path = self._sbx._path(f"/commands/{_quote(pid)}/events")
        state = {"last_id": last_event_id or ""}

        def events() -> Iterator[dict]:
            reconnects = 0
            while True:
                headers = {"Last-Event-ID": state["last_id"]} if state["last_id"] else {}
                resp = c._with_retries(lambda: c._open("GET", path, None, headers, None, _EVENT_STREAM), "always")
                got = 0
                broken: Any = "the stream ended before the exit event"
                try:
                    for event in _read_sse(resp, state["last_id"]):
                        got += 1
                        state["last_id"] = event["id"]
                        yield event
                        if event["type"] == "exit":
                            return
                    if got == 0:
                        return  # attached after the end: nothing more comes
                except (OSError, http.client.HTTPException) as err:
                    broken = err
                finally:
                    resp.close()
                if reconnects >= c.max_retries:
                    raise KuboError(0, "connection_failed", f"reading the command's events: {broken}")
                c._sleep(c._backoff(reconnects))
                reconnects += 1
        return events()


class SandboxFiles:
    """Files inside a sandbox, by path (absolute, e.g. /home/user/x, or
    relative to /home/user)."""

    def __init__(self, sandbox: Sandbox):
        self._sbx = sandbox

    def _path(self, path: str, rest: str = "") -> str:
        if not path:
            raise ValueError("empty path")
        return self._sbx._path("/files" + rest) + "?" + urllib.parse.urlencode({"path": path})

    def _get(self, path: str) -> tuple:
        c = self._sbx._client

        def once() -> tuple:
            with c._open("GET", self._path(path), None, {}, None, "*/*") as resp:
                try:
                    return _content_type(resp), resp.read()
                except (OSError, http.client.HTTPException) as err:
                    raise KuboError(0, "connection_failed", f"reading {path}: {err}") from err
        return c._with_retries(once, "always")

    def read(self, path: str) -> bytes:
        """The file's bytes. A directory raises IsADirectoryError."""
        ctype, raw = self._get(path)
        if ctype == "application/json":
            raise IsADirectoryError(path)
        return raw

    def list(self, path: str = "/home/user") -> list:
        """A directory's entries: name, path, type (file, dir, symlink,
        other), size, mode ("0644"), mtime. A file raises NotADirectoryError."""
        ctype, raw = self._get(path)
        if ctype != "application/json":
            raise NotADirectoryError(path)
        try:
            return _Wire.entries(json.loads(raw))
        except ValueError:
            raise KuboError(0, "invalid_response", "the listing is not JSON") from None

    def write(self, path: str, content) -> dict:
        """Upload bytes (or str, as UTF-8), making the parents; returns the file's entry."""
        if isinstance(content, str):
            content = content.encode("utf-8")
        if not isinstance(content, (bytes, bytearray)):
            raise TypeError("content must be bytes or str")
        c = self._sbx._client
        return c._with_retries(lambda: c._send("PUT", self._path(path), bytes(content),
                                               {"Content-Type": "application/octet-stream"}, None), "always")

    def remove(self, path: str) -> None:
        """Delete a file, or a directory with what is in it."""
        c = self._sbx._client
        c._with_retries(lambda: c._send("DELETE", self._path(path), None, {}, None), "always")

    def mkdir(self, path: str) -> dict:
        """Make a directory and its parents; returns its entry."""
        return self._sbx._client._call("POST", self._sbx._path("/files/mkdir"), {"path": path}, retry="always")

    def move(self, src: str, dst: str) -> dict:
        """Rename src to dst; returns dst's entry."""
        return self._sbx._client._call("POST", self._sbx._path("/files/move"), {"from": src, "to": dst},
                                       retry="rate_limit_only")


def _content_type(resp: Any) -> str:
    return (resp.headers.get("Content-Type") or "").split(";")[0].strip().lower()


def _read_sse(resp: Any, last_id: str, decode=None) -> Iterator[dict]:
    """The command events (or with decode, its events) of one
    event-stream response."""
    decode = decode or _Wire.event
    ctype = _content_type(resp)
    if ctype != _EVENT_STREAM:
        raise KuboError(0, "invalid_response", f"the event stream answered with Content-Type {ctype!r}")
    parser = _SSEParser(last_id)
    request_id = resp.headers.get("X-Request-ID")
    while True:
        chunk = resp.read1(65536)
        for sse_id, name, data in (parser.feed(chunk) if chunk else parser.finish()):
            event = decode(sse_id, name, data, request_id)
            if event is not None:
                yield event
        if not chunk:
            return


def create(client: "KuboClient", image: Optional[str] = None, timeout_s: Optional[int] = None, *,
           env: Optional[Mapping[str, str]] = None, metadata: Optional[Mapping[str, str]] = None,
           files: Optional[Files] = None, on_timeout: Optional[str] = None,
           network: Optional[Sequence[str]] = None,
           idempotency_key: Optional[str] = None) -> Sandbox:
    body: dict[str, Any] = {}
    if image:
        body["image"] = image
    if timeout_s is not None:
        body["timeout_s"] = timeout_s
    if env:
        body["env"] = dict(env)
    if metadata:
        body["metadata"] = dict(metadata)
    if files:
        body["files"] = _encode_files(files)
    if on_timeout:
        body["on_timeout"] = on_timeout
    if network is not None:
        body["network"] = _encode_network(network)
    key = idempotency_key or "vertal-" + uuid.uuid4().hex
    info = client._call("POST", _BASE, body, headers={"Idempotency-Key": key}, retry="always")
    return Sandbox(client, info)


def get(client: "KuboClient", id: str) -> Sandbox:  # noqa: A002
    if not id:
        raise ValueError("empty sandbox id")
    return Sandbox(client, client._call("GET", f"{_BASE}/{_quote(id)}", retry="always"))


def list_page(client: "KuboClient", status: Optional[str] = None, metadata: Optional[Mapping[str, str]] = None,
              limit: Optional[int] = None, cursor: Optional[str] = None) -> tuple:
    query: list = []
    if status:
        query.append(("status", status))
    for k, v in sorted((metadata or {}).items()):
        query.append(("metadata." + k, v))
    if limit is not None:
        query.append(("limit", str(limit)))
    if cursor:
        query.append(("cursor", cursor))
    path = _BASE + ("?" + urllib.parse.urlencode(query) if query else "")
    items, next_cursor = _Wire.sandbox_list(client._call("GET", path, retry="always"))
    return [Sandbox(client, s) for s in items], next_cursor
