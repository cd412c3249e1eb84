"""Check that a webhook request came from Vertal Run (standard library only).

    from vertal2kubo.webhook import verify_webhook, WebhookVerificationError

    try:
        verify_webhook(secret, headers["Vertal-Signature"], raw_body)
    except WebhookVerificationError as e:
        return 401, e.code

The ``Vertal-Signature`` header is ``t=<unix seconds>,v1=<hex HMAC-SHA256>``
of ``"<t>.<raw body>"``, keyed with the tenant's secret exactly as
``GET /v1/webhook-secret`` shows it (``whsec_...``, prefix included). Check
the raw bytes before decoding the JSON: re-encoded JSON is not what was
signed. Delivery is at least once; dedupe by the ``Vertal-Delivery`` header.
"""

from __future__ import annotations

import hashlib
import hmac
import time
from typing import List, Optional, Tuple, Union

__all__ = ["verify_webhook", "WebhookVerificationError", "DEFAULT_TOLERANCE",
           "HEADER_DELIVERY", "HEADER_EVENT", "HEADER_SIGNATURE"]

HEADER_DELIVERY = "Vertal-Delivery"
HEADER_EVENT = "Vertal-Event"
HEADER_SIGNATURE = "Vertal-Signature"

#: Seconds a signature's timestamp may be from the clock, either way, when
#: ``tolerance`` is 0 or less.
DEFAULT_TOLERANCE = 300

# t= is 1 to 12 ASCII digits, so every verifier (this one, the Go SDK's)
# reads the same number.
_MAX_TIMESTAMP_DIGITS = 12
_DIGITS = frozenset("0123456789")


class WebhookVerificationError(ValueError):
    """The request is not a valid Vertal Run webhook.

    Attributes:
        code: ``"malformed_header"``, ``"signature_mismatch"``,
            ``"timestamp_too_old"`` or ``"timestamp_too_new"``. The two
            timestamp codes are only given for a correctly signed body.
        message: a readable explanation.
    """

    def __init__(self, code: str, message: str):
        super().__init__(message)
        self.code = code
        self.message = message


def _malformed(why: str) -> WebhookVerificationError:
    return WebhookVerificationError("malformed_header", "malformed Vertal-Signature header: " + why)


def _parse(header: str) -> Tuple[str, List[bytes]]:
    if not header or not header.strip():
        raise _malformed("it is empty")
    ts: Optional[str] = None
    sigs: List[bytes] = []
    for item in header.split(","):
        key, sep, value = item.strip(" \t").partition("=")
        if not sep or not key:
            raise _malformed("every item must be key=value")
        if key == "t":
            if ts is not None:
                raise _malformed("t appears more than once")
            if not value or len(value) > _MAX_TIMESTAMP_DIGITS or not set(value) <= _DIGITS:
                raise _malformed("t must be unix seconds, 1 to 12 digits")
            ts = value
        elif key == "v1":
            # Compared as bytes: compare_digest refuses non-ASCII str.
            sigs.append(value.encode("utf-8"))
        # Other schemes (v0=...) are skipped, so a new one can be added beside v1.
    if ts is None:
        raise _malformed("no t= timestamp")
    if not sigs:
        raise _malformed("no v1= signature")
    return ts, sigs


def verify_webhook(secret: str, header: str, body: Union[bytes, str],
                   tolerance: float = DEFAULT_TOLERANCE, now: Optional[float] = None) -> None:
    """Raise WebhookVerificationError unless ``body`` was signed with ``secret``.

    ``header`` is the ``Vertal-Signature`` value; ``body`` the raw request
    body (a str is encoded as UTF-8). One matching ``v1=`` is enough, so a
    header may carry several. The timestamp must be within ``tolerance``
    seconds of ``now`` (default: ``time.time()``) either way; 0 or less means
    DEFAULT_TOLERANCE. Comparison is in constant time.
    """
    ts, sigs = _parse(header)
    if isinstance(body, str):
        body = body.encode("utf-8")
    key = secret.encode("utf-8") if isinstance(secret, str) else secret
    want = hmac.new(key, ts.encode("ascii") + b"." + body, hashlib.sha256).hexdigest().encode("ascii")
    match = False
    for sig in sigs:
        # Every value is compared, so the time says nothing about which matched.
        if hmac.compare_digest(want, sig):
            match = True
    if not match:
        raise WebhookVerificationError(
            "signature_mismatch", "no v1 signature in the Vertal-Signature header matches the body for this secret")
    if tolerance <= 0:
        tolerance = DEFAULT_TOLERANCE
    age = (time.time() if now is None else now) - int(ts)
    if age > tolerance:
        raise WebhookVerificationError(
            "timestamp_too_old", f"the signature's timestamp {ts} is {age:.0f}s old, more than the tolerance of {tolerance}s")
    if age < -tolerance:
        raise WebhookVerificationError(
            "timestamp_too_new",
            f"the signature's timestamp {ts} is {-age:.0f}s in the future, more than the tolerance of {tolerance}s")
