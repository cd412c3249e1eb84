// The relay: /api/* (and the origin-rendered docs) go to the origin with the
// edge secret the origin checks (`vertal serve --edge-secret`). Bodies and
// answers are streams end to end: nothing is buffered here, so an event
// stream (Accept: text/event-stream) reaches the client as the program runs
// and a large upload starts reaching the origin at once.

// The header the origin compares with its --edge-secret (internal/api).
export const EDGE_SECRET_HEADER = "X-Vertal-Edge-Secret";

// Hop-by-hop headers, which belong to one connection and are never relayed.
const HOP_BY_HOP = ["connection", "keep-alive", "proxy-connection", "te", "trailer", "upgrade"];

// The API's one error shape, {"error": {"code", "message"}, "request_id"},
// with a request id made here (the origin never saw the request).
export function apiError(status, code, message, extraHeaders = {}) {
  const requestID = newRequestID();
  const body = JSON.stringify({ error: { code, message }, request_id: requestID });
  return new Response(body, {
    status,
    headers: {
      "Content-Type": "application/json",
      "Cache-Control": "no-store",
      "X-Request-ID": requestID,
      "X-Content-Type-Options": "nosniff",
      ...extraHeaders,
    },
  });
}

// newRequestID has the origin's form: "req_" and 32 hex digits.
function newRequestID() {
  const b = crypto.getRandomValues(new Uint8Array(16));
  return "req_" + Array.from(b, (x) => x.toString(16).padStart(2, "0")).join("");
}

// maxBodyBytes reads MAX_BODY_BYTES (a positive integer); anything else is a
// deploy mistake, and the relay then refuses to run rather than guess.
export function maxBodyBytes(env) {
  const n = Number(env.MAX_BODY_BYTES);
  return Number.isSafeInteger(n) && n > 0 ? n : null;
}

// countedBody passes body through as it comes and fails it once more than
// max bytes have gone by, so a streamed upload (no Content-Length) is cut at
// the cap without being held here. over() tells afterwards whether it was:
// the origin may have answered the cut body (400) or the fetch failed, and
// either way the client gets 413. drain() then reads and drops the rest of
// the upload before that answer, as a lingering close does: a connection
// closed while the client is still sending is reset, and the reset can
// destroy the 413 before the client reads it.
function countedBody(body, max) {
  const reader = body.getReader();
  let seen = 0;
  let cut = false;
  const stream = new ReadableStream({
    async pull(controller) {
      const { done, value } = await reader.read();
      if (done) {
        controller.close();
        return;
      }
      seen += value.byteLength;
      if (seen > max) {
        cut = true;
        // Erroring this stream leaves the client's reader open for drain.
        controller.error(new Error(`request body over ${max} bytes`));
        return;
      }
      controller.enqueue(value);
    },
    cancel(reason) {
      return reader.cancel(reason);
    },
  });
  const drain = async () => {
    try {
      for (let n = 0; n < DRAIN_LIMIT; ) {
        const { done, value } = await reader.read();
        if (done) return;
        n += value.byteLength;
      }
      await reader.cancel("request body too large");
    } catch {
      // The client went away: nothing left to drain.
    }
  };
  return { stream, over: () => cut, drain };
}

// DRAIN_LIMIT bounds what is read and dropped after a cut: Cloudflare's own
// cap on a request body (Free and Pro plans).
const DRAIN_LIMIT = 100 << 20;

function tooLarge(max) {
  return apiError(
    413,
    "payload_too_large",
    `request body is larger than the ${max} bytes this edge relays`,
  );
}

// originHeaders copies the client's request for the origin: its
// headers less hop-by-hop ones and any edge secret the client sent, plus
// the real secret.
function originHeaders(request, secret) {
  const h = new Headers(request.headers);
  for (const name of HOP_BY_HOP) h.delete(name);
  // The origin's host comes from ORIGIN_URL: the site's Host would route
  // the subrequest back to this Worker's own zone.
  h.delete("Host");
  h.delete(EDGE_SECRET_HEADER);
  h.set(EDGE_SECRET_HEADER, secret);
  // The client's own X-Forwarded-For could say anything: only the
  // address Cloudflare saw is passed on.
  h.delete("X-Forwarded-For");
  const ip = request.headers.get("CF-Connecting-IP");
  if (ip) h.set("X-Forwarded-For", ip);
  h.set("X-Forwarded-Proto", new URL(request.url).protocol.replace(":", ""));
  return h;
}

// originURL is the origin's URL for the client's path and query.
function originURL(env, url, path = url.pathname) {
  const base = new URL(env.ORIGIN_URL);
  base.pathname = base.pathname.replace(/\/+$/, "") + path;
  base.search = url.search;
  return base;
}

// relay forwards an /api request to the origin and streams the answer back.
export async function relay(request, env) {
  const max = maxBodyBytes(env);
  if (!env.ORIGIN_URL || !env.EDGE_SECRET || max === null) {
    console.error("edge misconfigured: ORIGIN_URL, EDGE_SECRET and MAX_BODY_BYTES must all be set");
    return apiError(503, "unavailable", "the API is not reachable through this edge right now", { "Retry-After": "30" });
  }
  const url = new URL(request.url);
  let body = null;
  let over = () => false;
  let drain = async () => {};
  if (request.body !== null && request.method !== "GET" && request.method !== "HEAD") {
    const declared = request.headers.get("Content-Length");
    if (declared !== null) {
      const n = Number(declared);
      if (!Number.isSafeInteger(n) || n < 0) {
        return apiError(400, "invalid_request", "Content-Length is not a byte count");
      }
      if (n > max) return tooLarge(max);
      body = request.body; // the runtime holds the client to its declared length
    } else {
      ({ stream: body, over, drain } = countedBody(request.body, max));
    }
  }
  const init = {
    method: request.method,
    headers: originHeaders(request, env.EDGE_SECRET),
    body,
    redirect: "manual",
  };
  let resp;
  try {
    resp = await fetch(originURL(env, url), init);
  } catch (err) {
    if (over()) {
      await drain();
      return tooLarge(max);
    }
    console.error("origin fetch failed", String(err));
    return apiError(503, "unavailable", "the API origin cannot be reached; try again shortly", { "Retry-After": "5" });
  }
  if (over()) {
    await Promise.all([resp.body?.cancel(), drain()]);
    return tooLarge(max);
  }
  // The origin's answer as it is, its body a stream (an event stream
  // included): headers are copied only to drop hop-by-hop ones.
  const headers = new Headers(resp.headers);
  for (const name of HOP_BY_HOP) headers.delete(name);
  return new Response(resp.body, { status: resp.status, statusText: resp.statusText, headers });
}

// fromOrigin fetches a page the origin renders (the docs, their assets and
// the playground) with GET or HEAD only, at originPath.
export async function fromOrigin(request, env, originPath) {
  if (!env.ORIGIN_URL || !env.EDGE_SECRET) {
    console.error("edge misconfigured: ORIGIN_URL and EDGE_SECRET must be set");
    return null;
  }
  const url = new URL(request.url);
  try {
    const resp = await fetch(originURL(env, url, originPath), {
      method: request.method,
      headers: originHeaders(request, env.EDGE_SECRET),
      redirect: "manual",
      // Docs change only with a deploy of the origin: let Cloudflare's
      // cache answer most requests (ignored by a local workerd).
      cf: { cacheTtl: 300, cacheEverything: true },
    });
    const headers = new Headers(resp.headers);
    for (const name of HOP_BY_HOP) headers.delete(name);
    return new Response(resp.body, { status: resp.status, statusText: resp.statusText, headers });
  } catch (err) {
    console.error("origin fetch failed", String(err));
    return null;
  }
}
