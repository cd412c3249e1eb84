"""Python client for the Vertal Run API, using only the standard library.

    from vertal2kubo.client import KuboClient, KuboError

    client = KuboClient()            # KUBO_API_URL / KUBO_API_KEY
    result = client.run("print(6 * 7)")
    print(result["status"], result["stdout"])

Every call returns the API's JSON response as a dict (returned files have
their ``content`` decoded to bytes). A program that fails,
times out or runs out of memory is a normal result (look at
``result["status"]``); ``KuboError`` is raised only when the API refuses a
request or cannot be reached.

Requests refused with 503 (overloaded) or 429 (rate_limited), and runs
answered 409 idempotency_in_progress, are retried after the server's
Retry-After. ``run`` always sends an Idempotency-Key,
generating one when the caller gave none, so a retry never runs the code
twice.

``stream`` runs code like ``run`` but yields its output while it runs, and
``attach`` follows an execution started elsewhere; both read the API's
Server-Sent Events:

    for event in client.stream("import time\nprint(1, flush=True)\ntime.sleep(1)"):
        if event["type"] == "stdout":
            print(event["text"], end="")
        elif event["type"] == "result":
            print(event["execution"]["status"])

``submit`` queues a run and returns at once (the execution ``"queued"``),
``wait`` returns it once it is final, and ``batch`` queues up to 20 runs in
one request; a ``webhook_url`` has the server POST the signed result when
the run ends:

    queued = client.submit("print(6 * 7)", webhook_url="https://example.com/hook")
    result = client.wait(queued["id"], timeout=300)
"""

from __future__ import annotations

import base64
import email.utils
import http.client
import json
import os
import random
import time
import urllib.error
import urllib.parse
import urllib.request
import uuid
from typing import Any, Callable, Iterable, Iterator, Mapping, Optional, Sequence, Union

__all__ = ["KuboClient", "KuboError", "DEFAULT_URL"]

#: The hosted service, used when neither an URL nor KUBO_API_URL is given.
DEFAULT_URL = "https://vertalrun.com/api"

_VERSION = "0.2.0"
_FIRST_BACKOFF = 0.5
# One JSON answer or one event line: two 64 KB output streams plus the
# largest plan's returned files (50 MB) in base64, with room to spare.
_MAX_RESPONSE_BYTES = 96 << 20
_EVENT_STREAM = "text/event-stream"
_EVENT_TYPES = ("started", "stdout", "stderr", "result", "error")
# The statuses of an execution that has not ended; every other is final.
_UNFINISHED = ("queued", "running")
# The longest wait between two GETs when wait() polls.
_MAX_POLL_WAIT = 5.0
# The options of one run that a batch item may carry, besides its code.
_ITEM_KEYS = ("image", "language", "timeout_s", "stdin", "files", "env", "args", "return_files", "webhook_url",
              "network")

#: What ``files=`` takes: a mapping of path to content, or (path, content)
#: pairs; content is bytes or str.
Files = Union[Mapping[str, Union[bytes, str]], Iterable[tuple]]


class KuboError(Exception):
    """The API refused a request, or could not be reached.

    Attributes:
        status: HTTP status (e.g. 429); 0 when no response arrived.
        code: the API's error code, e.g. ``"quota_exceeded"``;
            ``"connection_failed"`` when the server could not be reached.
        message: the API's explanation.
        request_id: ``"req_..."``, to quote when asking for help.
        retry_after: seconds the server asked to wait, or None.
    """

    def __init__(self, status: int, code: str, message: str = "",
                 request_id: Optional[str] = None, retry_after: Optional[float] = None):
        super().__init__(status, code, message, request_id)
        self.status = status
        self.code = code
        self.message = message
        self.request_id = request_id
        self.retry_after = retry_after

    def __str__(self) -> str:
        text = f"{self.code}: {self.message}" if self.message else self.code
        details = [f"HTTP {self.status}"] if self.status else []
        if self.request_id:
            details.append(f"request {self.request_id}")
        return f"{text} ({', '.join(details)})" if details else text

    def __repr__(self) -> str:
        return (f"KuboError(status={self.status!r}, code={self.code!r}, "
                f"message={self.message!r}, request_id={self.request_id!r})")


class KuboClient:
    """A client for one Vertal Run server and one API key.

    Args:
        url: the base URL, e.g. ``"https://vertalrun.com/api"`` or
            ``"http://127.0.0.1:8080"``. Defaults to ``KUBO_API_URL``, then
            the hosted service.
        api_key: ``"kubo_sk_..."``. Defaults to ``KUBO_API_KEY``.
        max_retries: how often a refused request (503, 429) is retried.
        max_retry_wait: the longest single wait (seconds) before a retry;
            when the server asks for longer, the error is raised at once.
        timeout: socket timeout in seconds for each request. By default it
            is derived from the execution's timeout.
    """

    def __init__(self, url: Optional[str] = None, api_key: Optional[str] = None, *,
                 max_retries: int = 3, max_retry_wait: float = 30.0,
                 timeout: Optional[float] = None):
        url = (url or os.environ.get("KUBO_API_URL") or DEFAULT_URL).strip()
        parsed = urllib.parse.urlsplit(url)
        if parsed.scheme not in ("http", "https") or not parsed.netloc or parsed.query or parsed.fragment:
            raise ValueError(f"url {url!r} must be http(s)://host[:port][/path]")
        api_key = (api_key or os.environ.get("KUBO_API_KEY") or "").strip()
        if not api_key:
            raise ValueError("no API key: pass api_key or set KUBO_API_KEY")
        self.url = url.rstrip("/")
        self._api_key = api_key
        self.max_retries = max(0, max_retries)
        self.max_retry_wait = max_retry_wait
        self.timeout = timeout
        # Replaceable in tests.
        self._sleep: Callable[[float], None] = time.sleep
        self._now: Callable[[], float] = time.time

    def __repr__(self) -> str:  # never show the key
        return f"KuboClient({self.url!r})"

    @property
    def api_key(self) -> str:
        """The key in use; rotate_key() replaces it."""
        return self._api_key

    # -- the documented calls -------------------------------------------

    def run(self, code: str, language: str = "python", timeout_s: Optional[float] = None,
            idempotency_key: Optional[str] = None, stdin: Optional[str] = None, *,
            files: Optional[Files] = None, env: Optional[Mapping[str, str]] = None,
            args: Optional[Iterable[str]] = None, return_files: Optional[Iterable[str]] = None,
            image: Optional[str] = None, network: Optional[Sequence[str]] = None) -> dict:
        """Run code in a fresh sandbox and wait for the result.

        Returns the execution: id, status (succeeded, failed, timed_out,
        memory_exceeded), stdout, stderr, exit_code, duration_ms, truncated,
        usage, request_id, files, files_truncated, image and image_version
        (the image it ran on and the id of that image's build, None when
        the image was not built by vertal image build), and
        idempotent_replay on a replay.

        files are placed in the program's working directory: a mapping of
        relative path to bytes or str (or (path, content) pairs). env sets
        environment variables, args the program's arguments (sys.argv[1:]),
        and return_files lists globs ("*.png", "out/**") of files to hand
        back: each of ``result["files"]`` is {"path", "size", "content"}
        with content as bytes.

        network narrows the plan's egress allowlist for this run: host
        names ("pypi.org"), *.suffix wildcards and address ranges
        ("203.0.113.0/24"), each within the plan's (one beyond it is a 403
        ``forbidden`` KuboError); [] runs it without network, None (the
        default) with the plan's whole list, which is empty on the built-in
        plans. A run with a network has ``result["network"]``: allow,
        bytes_in, bytes_out, connections, refused and attempts (each
        {"host", "port", "kind", "allowed", "reason", ...}, the reason
        saying why it was refused or cut), and ``usage["network_bytes_in"]``
        and ``usage["network_bytes_out"]``; all absent without a network.

        The same idempotency_key with the same request returns the first
        result without running the code again.
        """
        body, key = self._run_body(code, language, timeout_s, idempotency_key, stdin, files, env, args, return_files,
                                   image, network)
        wait = self.timeout if self.timeout is not None else float(timeout_s or 10) + 120.0
        result = self._call("POST", "/v1/executions", body, headers={"Idempotency-Key": key},
                            retry="always", timeout=wait)
        return _decode_files(result)

    def stream(self, code: str, language: str = "python", timeout_s: Optional[float] = None,
               idempotency_key: Optional[str] = None, stdin: Optional[str] = None, *,
               files: Optional[Files] = None, env: Optional[Mapping[str, str]] = None,
               args: Optional[Iterable[str]] = None, return_files: Optional[Iterable[str]] = None,
               image: Optional[str] = None, network: Optional[Sequence[str]] = None) -> Iterator[dict]:
        """Run code like run(), yielding events while it runs.

        Each event is a dict with "type" and "id" (the event id, to resume
        from with attach) and "execution_id":

        - ``started``: also "language";
        - ``stdout`` / ``stderr``: "text", a chunk of output;
        - ``result``: "execution", what run() returns; it is the last event.

        A refusal before the start raises KuboError as run() does (after
        the same retries); a platform failure after the start raises
        KuboError with status 0 and the error's code. A dropped connection
        is resumed with attach() after the last event, so no output is lost
        or repeated. Closing the generator (or leaving the loop) closes the
        connection; the run goes on and its result is stored. A server that
        does not stream answers JSON, which is turned into the same events.
        """
        body, key = self._run_body(code, language, timeout_s, idempotency_key, stdin, files, env, args, return_files,
                                   image, network)
        data = json.dumps(body).encode("utf-8")

        def first() -> Any:
            return self._with_retries(lambda: self._open("POST", "/v1/executions", data, {"Idempotency-Key": key},
                                                         None, _EVENT_STREAM), "always")
        return self._events(first, {"execution_id": None, "last_id": None})

    def attach(self, id: str, last_event_id: Optional[str] = None) -> Iterator[dict]:  # noqa: A002
        """Follow an execution of this key's tenant (queued, running or
        finished) with GET /v1/executions/{id}/events, yielding events like
        stream(). Without last_event_id it replays from the start; with an
        event's "id" it resumes after that event (after "end", nothing)."""
        if not id:
            raise ValueError("empty execution id")
        return self._events(None, {"execution_id": id, "last_id": last_event_id})

    def submit(self, code: str, language: str = "python", timeout_s: Optional[float] = None,
               idempotency_key: Optional[str] = None, stdin: Optional[str] = None, *,
               files: Optional[Files] = None, env: Optional[Mapping[str, str]] = None,
               args: Optional[Iterable[str]] = None, return_files: Optional[Iterable[str]] = None,
               webhook_url: Optional[str] = None, image: Optional[str] = None,
               network: Optional[Sequence[str]] = None) -> dict:
        """Queue code for an asynchronous run and return at once.

        Takes the arguments of run(), plus webhook_url: an https URL the
        server POSTs the final execution to, signed (see verify_webhook).
        The server answers 202 with the execution, ``"status": "queued"``
        (its quota already reserved) and ``"webhook"`` (the delivery
        state, or None). Follow it with wait(), get() or attach().

        Like run(), it always sends an Idempotency-Key, so a retry never
        queues the code twice; with the same idempotency_key a repeat
        returns the first request's execution.
        """
        body, key = self._run_body(code, language, timeout_s, idempotency_key, stdin, files, env, args, return_files,
                                   image, network)
        body["async"] = True
        if webhook_url:
            body["webhook_url"] = webhook_url
        result = self._call("POST", "/v1/executions", body, headers={"Idempotency-Key": key}, retry="always")
        if not isinstance(result, dict) or not result.get("id"):
            raise KuboError(0, "invalid_response", "submit answered without an execution id")
        return _decode_files(result)

    def wait(self, id: str, timeout: Optional[float] = None) -> dict:  # noqa: A002
        """Return the execution once it is final (any status but queued
        and running), as run() would have.

        It follows the execution's event stream, so it learns of the end
        at once; when the stream cannot be had or breaks for good (or
        ends in an error event), it polls get(), waiting longer between
        tries up to 5 seconds. KuboError comes from the GET (an unknown id
        is ``not_found``). With timeout (seconds) it raises TimeoutError
        if the execution is not final by then; the execution goes on.
        """
        if not id:
            raise ValueError("empty execution id")
        deadline = None if timeout is None else time.monotonic() + timeout
        events = self._events(None, {"execution_id": id, "last_id": None, "deadline": deadline})
        try:
            for event in events:
                if event["type"] == "result" and event["execution"].get("status") not in _UNFINISHED:
                    return event["execution"]
        except KuboError:
            pass  # an error event or a lost stream: the stored execution tells
        finally:
            events.close()
        attempt = 0
        while True:
            _check_deadline(deadline, id)
            execution = self.get(id)
            if execution.get("status") not in _UNFINISHED:
                return execution
            pause = min(self._backoff(attempt), _MAX_POLL_WAIT)
            if deadline is not None:
                pause = max(min(pause, deadline - time.monotonic()), 0.0)
            self._sleep(pause)
            attempt += 1

    def batch(self, items: Iterable[Mapping[str, Any]], webhook_url: Optional[str] = None, *,
              idempotency_key: Optional[str] = None) -> list:
        """Queue up to 20 runs in one request (POST /v1/executions/batch)
        and return their executions, queued, in the order of items.

        Each item is a dict with "code" and any of run()'s options by name
        (image, language, timeout_s, stdin, files, env, args, return_files,
        network) and its own webhook_url, which wins over the batch's. The
        server takes all or none: an invalid item raises KuboError (400
        invalid_request) whose message names it, e.g.
        ``executions[3].language: ...``; a batch over the day's quota
        raises quota_exceeded and nothing runs. Retries and the
        Idempotency-Key work as for submit().
        """
        executions = []
        for i, item in enumerate(items):
            unknown = sorted(set(item) - set(_ITEM_KEYS) - {"code"})
            if unknown or "code" not in item:
                raise TypeError(f"batch item {i}: " + (f"unknown keys {unknown}" if unknown else "no code"))
            body, _ = self._run_body(item["code"], item.get("language") or "python", item.get("timeout_s"), None,
                                     item.get("stdin"), item.get("files"), item.get("env"), item.get("args"),
                                     item.get("return_files"), item.get("image"), item.get("network"))
            if item.get("webhook_url"):
                body["webhook_url"] = item["webhook_url"]
            executions.append(body)
        if not executions:
            raise ValueError("a batch needs at least one item")
        body = {"executions": executions}
        if webhook_url:
            body["webhook_url"] = webhook_url
        key = idempotency_key or "vertal-" + uuid.uuid4().hex
        result = self._call("POST", "/v1/executions/batch", body, headers={"Idempotency-Key": key}, retry="always")
        answered = result.get("executions") if isinstance(result, dict) else None
        if not isinstance(answered, list) or len(answered) != len(executions):
            raise KuboError(0, "invalid_response", f"batch of {len(executions)} answered "
                            f"{len(answered) if isinstance(answered, list) else 'no'} executions")
        return [_decode_files(e) for e in answered]

    def get(self, id: str) -> dict:  # noqa: A002 - the documented name
        """Return a stored execution of this key's tenant, with language
        and created_at (Unix seconds)."""
        if not id:
            raise ValueError("empty execution id")
        # Returned files decoded to bytes, as every call has them.
        return _decode_files(self._call("GET", "/v1/executions/" + urllib.parse.quote(id, safe=""), retry="always"))

    def usage(self) -> dict:
        """Return today's usage (UTC) and the plan's limits."""
        return self._call("GET", "/v1/usage", retry="always")

    def rotate_key(self) -> dict:
        """Issue a new key (same tenant and plan) and revoke the current one.

        The client switches to the new key. The result holds it
        (``api_key``); it is shown only once, so store it.
        """
        # Only a 429 is retried: anything else may hide a rotation that
        # happened, and the revoked key could not retry anyway.
        result = self._call("POST", "/v1/keys/rotate", None, retry="rate_limit_only")
        new_key = result.get("api_key")
        if not new_key:
            raise KuboError(0, "invalid_response", "rotate response carried no api_key")
        self._api_key = new_key
        return result

    def images(self) -> list:
        """List the images this key may run on, with languages and packages.

        Choose one with run(..., image="datasci")."""
        result = self._call("GET", "/v1/images", retry="always")
        return result["images"] if isinstance(result, dict) else result

    def languages(self) -> list:
        """List the languages the server runs, with versions."""
        result = self._call("GET", "/v1/languages", retry="always")
        return result["languages"] if isinstance(result, dict) else result

    # -- sandboxes that stay (vertal2kubo.sandbox) -------------------------

    def create_sandbox(self, image: Optional[str] = None, timeout_s: Optional[int] = None, *,
                       env: Optional[Mapping[str, str]] = None, metadata: Optional[Mapping[str, str]] = None,
                       files: Optional[Files] = None, on_timeout: Optional[str] = None,
                       network: Optional[Sequence[str]] = None,
                       idempotency_key: Optional[str] = None) -> Any:
        """Create a sandbox that stays (POST /v1/sandboxes) and return it
        as a ``vertal2kubo.sandbox.Sandbox``, running.

        network narrows the plan's egress allowlist (names, *.suffix
        wildcards, CIDRs; beyond the plan's is a 403 ApiError); [] is no
        network, None the plan's (none on the built-in plans).

        timeout_s is its lifetime from now (extend it with set_timeout);
        on_timeout "pause" pauses it at the end instead of killing it.
        files (as for run()) are placed under /home/user, env is the
        environment of its commands, metadata string pairs to find it by.
        Like run(), it always sends an Idempotency-Key, so a retry never
        creates two."""
        from . import sandbox
        return sandbox.create(self, image, timeout_s, env=env, metadata=metadata, files=files,
                              on_timeout=on_timeout, network=network, idempotency_key=idempotency_key)

    def get_sandbox(self, id: str) -> Any:  # noqa: A002
        """An existing sandbox of this key's tenant, by its sbx_ id."""
        from . import sandbox
        return sandbox.get(self, id)

    def list_sandboxes(self, status: Optional[str] = None, metadata: Optional[Mapping[str, str]] = None,
                       limit: Optional[int] = None, cursor: Optional[str] = None) -> dict:
        """One page of this tenant's sandboxes, newest first:
        ``{"sandboxes": [Sandbox, ...], "next_cursor": str or None}``;
        pass next_cursor as cursor for the next page. status (running,
        paused, ended) and metadata (every pair must match) filter."""
        from . import sandbox
        items, next_cursor = sandbox.list_page(self, status, metadata, limit, cursor)
        return {"sandboxes": items, "next_cursor": next_cursor}

    # -- plumbing --------------------------------------------------------

    def _run_body(self, code, language, timeout_s, idempotency_key, stdin, files, env, args, return_files,
                  image=None, network=None):
        body: dict[str, Any] = {"language": language, "code": code}
        if image:
            body["image"] = image
        if timeout_s is not None:
            body["timeout_s"] = timeout_s
        if stdin is not None and stdin != "":
            body["stdin"] = stdin
        if files:
            body["files"] = _encode_files(files)
        if env:
            body["env"] = dict(env)
        if args:
            body["args"] = list(args)
        if return_files:
            body["return_files"] = list(return_files)
        if network is not None:
            body["network"] = _encode_network(network)
        return body, idempotency_key or "vertal-" + uuid.uuid4().hex

    def _call(self, method: str, path: str, body: Any = None, *, headers: Optional[dict] = None,
              retry: str, timeout: Optional[float] = None) -> Any:
        data = None if body is None else json.dumps(body).encode("utf-8")
        return self._with_retries(lambda: self._send(method, path, data, headers or {}, timeout), retry)

    def _with_retries(self, attempt_once: Callable[[], Any], retry: str) -> Any:
        attempt = 0
        while True:
            try:
                return attempt_once()
            except KuboError as err:
                wait = self._retry_wait(err, retry, attempt)
                if wait is None or attempt >= self.max_retries:
                    raise
            attempt += 1
            self._sleep(wait)

    def _open(self, method: str, path: str, data: Optional[bytes], headers: dict,
              timeout: Optional[float], accept: str = "application/json") -> Any:
        """Send one request; return the open 2xx response, raise KuboError otherwise."""
        req = urllib.request.Request(self.url + path, data=data, method=method)
        req.add_header("Authorization", "Bearer " + self._api_key)
        req.add_header("Accept", accept)
        req.add_header("User-Agent", f"vertal2kubo-python/{_VERSION}")
        if data is not None:
            req.add_header("Content-Type", "application/json")
        for k, v in headers.items():
            req.add_header(k, v)
        try:
            return urllib.request.urlopen(req, timeout=timeout if timeout is not None else (self.timeout or 60.0))
        except urllib.error.HTTPError as err:
            raw = err.read(_MAX_RESPONSE_BYTES) if err.fp else b""
            raise self._api_error(err.code, err.headers, raw) from None
        except (urllib.error.URLError, OSError) as err:
            reason = getattr(err, "reason", err)
            raise KuboError(0, "connection_failed", f"cannot reach {self.url}: {reason}") from err

    def _send(self, method: str, path: str, data: Optional[bytes], headers: dict,
              timeout: Optional[float]) -> Any:
        with self._open(method, path, data, headers, timeout) as resp:
            try:
                raw = resp.read(_MAX_RESPONSE_BYTES)
            except (OSError, http.client.HTTPException) as err:
                raise KuboError(0, "connection_failed", f"reading the answer of {self.url}: {err}") from err
        try:
            return json.loads(raw)
        except ValueError:
            raise KuboError(0, "invalid_response", f"{method} {path}: the response is not JSON") from None

    def _open_events(self, execution_id: str, last_id: Optional[str], deadline: Optional[float] = None) -> Any:
        headers = {"Last-Event-ID": last_id} if last_id else {}
        path = "/v1/executions/" + urllib.parse.quote(execution_id, safe="") + "/events"
        timeout = None
        if deadline is not None:
            # A stream silent past the deadline times out instead of holding on.
            timeout = max(min(self.timeout or 60.0, deadline - time.monotonic()), 0.001)
        return self._with_retries(lambda: self._open("GET", path, None, headers, timeout, _EVENT_STREAM), "always")

    def _events(self, first: Optional[Callable[[], Any]], state: dict) -> Iterator[dict]:
        """Yield the events of a stream, reconnecting when it breaks early."""
        opener = first or (lambda: self._open_events(state["execution_id"], state["last_id"], state.get("deadline")))
        reconnects = 0
        while True:
            resp = opener()
            try:
                done = yield from self._read_events(resp, state)
                broken: Any = "the stream ended before its result"
            except (OSError, http.client.HTTPException) as err:
                done, broken = False, err
            finally:
                resp.close()
            if done:
                return
            _check_deadline(state.get("deadline"), state["execution_id"])
            if reconnects >= self.max_retries:
                raise KuboError(0, "connection_failed", f"reading the event stream of {self.url}: {broken}")
            self._sleep(self._backoff(reconnects))
            reconnects += 1
            if state["execution_id"]:
                opener = lambda: self._open_events(state["execution_id"], state["last_id"], state.get("deadline"))  # noqa: E731
            # else: the same POST again, under the same Idempotency-Key

    def _read_events(self, resp: Any, state: dict):
        """Yield one response's events; return True once the stream is over."""
        content_type = (resp.headers.get("Content-Type") or "").split(";")[0].strip().lower()
        if content_type == "application/json":
            yield from _buffered_events(json.loads(resp.read(_MAX_RESPONSE_BYTES)))
            return True
        if content_type != _EVENT_STREAM:
            raise KuboError(0, "invalid_response", f"the event stream answered with Content-Type {content_type!r}")
        parser = _SSEParser(state["last_id"])
        request_id = resp.headers.get("X-Request-ID")
        while True:
            chunk = resp.read1(65536)
            _check_deadline(state.get("deadline"), state["execution_id"])
            events = parser.feed(chunk) if chunk else parser.finish()
            for sse_id, name, data in events:
                state["last_id"] = sse_id
                event = _decode_event(sse_id, name, data, request_id)
                if event is None:
                    continue  # a type this version does not know
                if event["type"] == "started":
                    state["execution_id"] = event["execution_id"]
                event["execution_id"] = state["execution_id"]
                yield event
                if event["type"] == "result":
                    return True
            state["last_id"] = parser.last_id
            if not chunk:
                return parser.last_id == "end"  # attached after the end: nothing more

    def _api_error(self, status: int, headers: Any, raw: bytes) -> KuboError:
        retry_after = _parse_retry_after(headers.get("Retry-After") if headers else None, self._now())
        header_id = headers.get("X-Request-ID") if headers else None
        try:
            body = json.loads(raw)
            err = body["error"]
            code, message = err["code"], err.get("message", "")
            request_id = body.get("request_id") or header_id
        except (ValueError, KeyError, TypeError):
            code, message, request_id = f"http_{status}", _reason(status), header_id
        return KuboError(status, code, message, request_id, retry_after)

    def _retry_wait(self, err: KuboError, policy: str, attempt: int) -> Optional[float]:
        """Seconds to wait before retrying, or None not to retry."""
        if err.status == 0:
            # No answer: only idempotent calls may be sent again.
            if err.code != "connection_failed" or policy != "always":
                return None
            return self._backoff(attempt)
        if err.status == 429 and err.code == "quota_exceeded":
            return None  # the daily quota does not come back within a retry
        in_progress = err.status == 409 and err.code == "idempotency_in_progress"
        if not (err.status == 429 or (policy == "always" and (err.status == 503 or in_progress))):
            return None
        if not err.retry_after:
            return self._backoff(attempt)
        if err.retry_after > self.max_retry_wait:
            return None
        return err.retry_after

    def _backoff(self, attempt: int) -> float:
        d = _FIRST_BACKOFF * (2 ** min(attempt, 10))
        return min(d + random.uniform(0, d / 4), self.max_retry_wait)


class _SSEParser:
    """An event stream parser following the WHATWG HTML standard: lines end
    in CRLF, LF or CR; a blank line dispatches; ':' starts a comment; data
    lines are joined with newlines; an id with NUL is ignored; an event
    cut off by the end of the stream is dropped."""

    def __init__(self, last_id: Optional[str] = None):
        self.last_id = last_id or ""
        self._id = self.last_id
        self._buf = bytearray()
        self._scan = 0  # where to look for the next line ending
        self._data: list = []
        self._event = ""
        self._first = True

    def feed(self, chunk: bytes) -> list:
        """Take bytes; return the events they complete as (id, type, data)."""
        self._buf += chunk
        return self._lines(at_eof=False)

    def finish(self) -> list:
        return self._lines(at_eof=True)

    def _lines(self, at_eof: bool) -> list:
        events = []
        buf = self._buf
        start = 0
        while True:
            cr, lf = buf.find(b"\r", max(self._scan, start)), buf.find(b"\n", max(self._scan, start))
            ends = [i for i in (cr, lf) if i >= 0]
            if not ends:
                self._scan = len(buf)
                break
            i = min(ends)
            if buf[i] == 0x0D:
                if i + 1 == len(buf) and not at_eof:
                    self._scan = i
                    break  # a CR at the end may be the first half of a CRLF
                end = i + 2 if i + 1 < len(buf) and buf[i + 1] == 0x0A else i + 1
            else:
                end = i + 1
            event = self._line(bytes(buf[start:i]).decode("utf-8", "replace"))
            if event:
                events.append(event)
            start, self._scan = end, end
        del buf[:start]
        self._scan = max(self._scan - start, 0)
        if len(buf) > _MAX_RESPONSE_BYTES:
            raise KuboError(0, "invalid_response", "an event stream line is too long")
        return events

    def _line(self, line: str):
        if self._first:
            self._first = False
            line = line.removeprefix("\ufeff")
        if line == "":
            self.last_id = self._id
            data, event = self._data, self._event
            self._data, self._event = [], ""
            if not data:
                return None
            return self.last_id, event or "message", "\n".join(data)
        if line.startswith(":"):
            return None
        field, colon, value = line.partition(":")
        if colon and value.startswith(" "):
            value = value[1:]
        if field == "event":
            self._event = value
        elif field == "data":
            self._data.append(value)
        elif field == "id" and "\0" not in value:
            self._id = value
        return None


def _check_deadline(deadline: Optional[float], execution_id: Optional[str]) -> None:
    """Raise TimeoutError once time.monotonic() is past deadline (None: never)."""
    if deadline is not None and time.monotonic() >= deadline:
        raise TimeoutError(f"execution {execution_id} did not finish in time; it goes on, wait() again to follow it")


def _decode_event(sse_id: str, name: str, data: str, request_id: Optional[str]) -> Optional[dict]:
    if name not in _EVENT_TYPES:
        return None
    try:
        payload = json.loads(data)
    except ValueError:
        raise KuboError(0, "invalid_response", f"the {name} event is not JSON") from None
    event: dict[str, Any] = {"type": name, "id": sse_id}
    if name == "started":
        event["execution_id"], event["language"] = payload.get("id"), payload.get("language")
    elif name in ("stdout", "stderr"):
        event["text"] = payload.get("text", "")
    elif name == "result":
        event["execution"] = _decode_files(payload)
    else:
        err = payload.get("error") or {}
        raise KuboError(0, err.get("code") or "stream_error", err.get("message", ""),
                        payload.get("request_id") or request_id)
    return event


def _buffered_events(execution: dict) -> Iterator[dict]:
    """The events a streaming server would have sent for this execution."""
    out, err = execution.get("stdout") or "", execution.get("stderr") or ""
    n_out, n_err = len(out.encode("utf-8")), len(err.encode("utf-8"))
    exe = execution.get("id")
    yield {"type": "started", "id": "0-0", "execution_id": exe, "language": execution.get("language")}
    if out:
        yield {"type": "stdout", "id": f"{n_out}-0", "execution_id": exe, "text": out}
    if err:
        yield {"type": "stderr", "id": f"{n_out}-{n_err}", "execution_id": exe, "text": err}
    yield {"type": "result", "id": "end", "execution_id": exe, "execution": _decode_files(execution)}


def _encode_files(files: Files) -> list:
    """Files as the API takes them: text as utf8, anything else as base64."""
    pairs = files.items() if isinstance(files, Mapping) else files
    out = []
    for path, content in pairs:
        if isinstance(content, str):
            content = content.encode("utf-8")
        if not isinstance(content, (bytes, bytearray)):
            raise TypeError(f"file {path!r}: content must be bytes or str")
        try:
            text = bytes(content).decode("utf-8")
        except UnicodeDecodeError:
            text = None
        if text is not None and "\0" not in text:
            out.append({"path": path, "content": text, "encoding": "utf8"})
        else:
            out.append({"path": path, "content": base64.b64encode(content).decode("ascii"), "encoding": "base64"})
    return out


def _encode_network(network: Sequence[str]) -> dict:
    """A request's "network": the allowlist asked for; [] is none."""
    if isinstance(network, (str, bytes)):
        raise TypeError("network is a list of names, *.suffix wildcards and CIDRs, not a string")
    return {"allow": list(network)}


def _decode_files(execution: Any) -> Any:
    """Turn the returned files' content into bytes, in place."""
    if isinstance(execution, dict):
        for f in execution.get("files") or []:
            encoding = f.pop("encoding", "base64")
            content = f.get("content") or ""
            if encoding == "utf8":
                f["content"] = content.encode("utf-8")
            else:
                try:
                    f["content"] = base64.b64decode(content, validate=True)
                except ValueError:
                    raise KuboError(0, "invalid_response", f"returned file {f.get('path')!r} is not base64") from None
    return execution


def _parse_retry_after(value: Optional[str], now: float) -> Optional[float]:
    if not value:
        return None
    value = value.strip()
    if value.isdigit():
        return float(value)
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(when.timestamp() - now, 0.0)


def _reason(status: int) -> str:
    from http import HTTPStatus
    try:
        return HTTPStatus(status).phrase
    except ValueError:
        return ""
