"""Python client for the Vertal Run API, using only the standard library.

    from vertal2kubo.client import KuboClient, KuboError

    client = KuboClient()            # KUBO_API_URL / KUBO_API_KEY
    result = client.run("print(6 * 7)")
    print(result["status"], result["stdout"])

Every call returns the API's JSON response as a dict. A program that fails,
times out or runs out of memory is a normal result (look at
``result["status"]``); ``KuboError`` is raised only when the API refuses a
request or cannot be reached.

Requests refused with 503 (overloaded) or 429 (rate_limited), and runs
answered 409 idempotency_in_progress, are retried after the server's
Retry-After. ``run`` always sends an Idempotency-Key,
generating one when the caller gave none, so a retry never runs the code
twice.
"""

from __future__ import annotations

import email.utils
import json
import os
import random
import time
import urllib.error
import urllib.parse
import urllib.request
import uuid
from typing import Any, Callable, Optional

__all__ = ["KuboClient", "KuboError", "DEFAULT_URL"]

#: The hosted service, used when neither an URL nor KUBO_API_URL is given.
DEFAULT_URL = "https://vertalrun.com/api"

_VERSION = "0.2.0"
_FIRST_BACKOFF = 0.5
_MAX_RESPONSE_BYTES = 16 << 20


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
            idempotency_key: Optional[str] = None, stdin: Optional[str] = None) -> dict:
        """Run code in a fresh sandbox and wait for the result.

        Returns the execution: id, status (succeeded, failed, timed_out,
        memory_exceeded), stdout, stderr, exit_code, duration_ms, truncated,
        usage, request_id (and idempotent_replay on a replay).

        The same idempotency_key with the same request returns the first
        result without running the code again.
        """
        body: dict[str, Any] = {"language": language, "code": code}
        if timeout_s is not None:
            body["timeout_s"] = timeout_s
        if stdin is not None and stdin != "":
            body["stdin"] = stdin
        key = idempotency_key or "vertal-" + uuid.uuid4().hex
        wait = self.timeout if self.timeout is not None else float(timeout_s or 10) + 120.0
        return self._call("POST", "/v1/executions", body, headers={"Idempotency-Key": key},
                          retry="always", timeout=wait)

    def get(self, id: str) -> dict:  # noqa: A002 - the documented name
        """Return a stored execution of this key's tenant, with language
        and created_at (Unix seconds)."""
        if not id:
            raise ValueError("empty execution id")
        return self._call("GET", "/v1/executions/" + urllib.parse.quote(id, safe=""), retry="always")

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

    def languages(self) -> list:
        """List the languages the server runs, with versions."""
        result = self._call("GET", "/v1/languages", retry="always")
        return result["languages"] if isinstance(result, dict) else result

    # -- plumbing --------------------------------------------------------

    def _call(self, method: str, path: str, body: Any = None, *, headers: Optional[dict] = None,
              retry: str, timeout: Optional[float] = None) -> Any:
        data = None if body is None else json.dumps(body).encode("utf-8")
        attempt = 0
        while True:
            try:
                return self._send(method, path, data, headers or {}, timeout)
            except KuboError as err:
                wait = self._retry_wait(err, retry, attempt)
                if wait is None or attempt >= self.max_retries:
                    raise
            attempt += 1
            self._sleep(wait)

    def _send(self, method: str, path: str, data: Optional[bytes], headers: dict,
              timeout: Optional[float]) -> Any:
        req = urllib.request.Request(self.url + path, data=data, method=method)
        req.add_header("Authorization", "Bearer " + self._api_key)
        req.add_header("Accept", "application/json")
        req.add_header("User-Agent", f"vertal2kubo-python/{_VERSION}")
        if data is not None:
            req.add_header("Content-Type", "application/json")
        for k, v in headers.items():
            req.add_header(k, v)
        try:
            with urllib.request.urlopen(req, timeout=timeout if timeout is not None else (self.timeout or 60.0)) as resp:
                raw = resp.read(_MAX_RESPONSE_BYTES)
        except urllib.error.HTTPError as err:
            raw = err.read(_MAX_RESPONSE_BYTES) if err.fp else b""
            raise self._api_error(err.code, err.headers, raw) from None
        except (urllib.error.URLError, OSError) as err:
            reason = getattr(err, "reason", err)
            raise KuboError(0, "connection_failed", f"cannot reach {self.url}: {reason}") from err
        try:
            return json.loads(raw)
        except ValueError:
            raise KuboError(0, "invalid_response", f"{method} {path}: the response is not JSON") from None

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
