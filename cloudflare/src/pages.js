// The site's own pages: landing, pricing and not-found. Every value that
// goes into markup passes through escapeHTML, and the pages have no script
// at all; they are served under the same Content-Security-Policy as the
// origin's playground (platform.json, generated from internal/web).
import platform from "./platform.json";
import { STYLE } from "./style.js";

export const CSP = platform.content_security_policy;

// escapeHTML makes any string safe as element text or a quoted attribute.
export function escapeHTML(s) {
  return String(s)
    .replaceAll("&", "&amp;")
    .replaceAll("<", "&lt;")
    .replaceAll(">", "&gt;")
    .replaceAll('"', "&quot;")
    .replaceAll("'", "&#39;");
}

// html is a tagged template that escapes every interpolated value unless it
// is already markup made by html (a Markup).
class Markup {
  constructor(s) {
    this.s = s;
  }
  toString() {
    return this.s;
  }
}

function html(strings, ...values) {
  let out = strings[0];
  values.forEach((v, i) => {
    out += render(v) + strings[i + 1];
  });
  return new Markup(out);
}

function render(v) {
  if (v instanceof Markup) return v.s;
  if (Array.isArray(v)) return v.map(render).join("");
  if (v === null || v === undefined || v === false) return "";
  return escapeHTML(v);
}

// SECURITY_HEADERS are those the origin's web pages carry (internal/web).
export function securityHeaders(contentType) {
  return {
    "Content-Type": contentType,
    "Content-Security-Policy": CSP,
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "X-Frame-Options": "DENY",
    "Cross-Origin-Opener-Policy": "same-origin",
    "Cross-Origin-Resource-Policy": "same-origin",
    "Permissions-Policy": "camera=(), microphone=(), geolocation=(), payment=(), usb=()",
  };
}

// STYLE_PATH names the style sheet with a hash of its text, so browsers may
// keep it for good and still get a new one with each deploy.
export const STYLE_PATH = "/_site/style.css?v=" + hash(STYLE);

function hash(s) {
  let h = 2166136261; // FNV-1a, only to tell versions apart
  for (let i = 0; i < s.length; i++) h = Math.imul(h ^ s.charCodeAt(i), 16777619) >>> 0;
  return h.toString(16);
}

function layout(title, body) {
  return html`<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>${title}</title>
<link rel="stylesheet" href="${STYLE_PATH}">
</head>
<body>
<header class="top"><a class="brand" href="/">Vertal Run</a>
<nav><a href="/pricing">Pricing</a> <a href="/docs/">Docs</a> <a href="/playground">Playground</a></nav></header>
<main>
${body}
</main>
<footer>Vertal Run runs untrusted code in sandboxes. <a href="/docs/security">Security model</a></footer>
</body>
</html>
`.s;
}

export function landingPage() {
  return layout(
    "Vertal Run: run untrusted code in sandboxes",
    html`<section class="hero">
<h1>Run untrusted code, safely, with one HTTP call</h1>
<p>Vertal Run runs Python, JavaScript and Bash in isolated sandboxes with no network,
hard limits on time, memory and processes, and output streamed as it is written.
Use it from the REST API, the Go and Python SDKs, or as an MCP server for agents.</p>
<p><a class="button" href="/docs/quickstart">Quickstart</a> <a href="/pricing">Plans and limits</a></p>
</section>
<section>
<h2>One call</h2>
<pre><code>curl -s https://vertalrun.com/api/v1/executions \\
  -H "Authorization: Bearer kubo_sk_..." \\
  -H "Content-Type: application/json" \\
  -d '{"language": "python", "code": "print(sum(range(10)))"}'</code></pre>
</section>
<section>
<h2>Self-host it</h2>
<p>The whole platform is one Go binary. Run it on one server with a Cloudflare Tunnel,
or on several nodes sharing PostgreSQL. See <a href="/docs/">the docs</a>.</p>
</section>`,
  );
}

// formatCount writes 10000 as "10,000".
function formatCount(n) {
  return String(n).replace(/\B(?=(\d{3})+(?!\d))/g, ",");
}

export function pricingPage() {
  const fields = platform.plan_fields;
  const rows = platform.plans.map(
    (p) => html`<tr data-plan="${p.name}"><th scope="row">${p.name}</th>${fields.map(
      (f) => html`<td data-field="${f.field}" data-value="${p.limits[f.field]}">${formatCount(p.limits[f.field])}${f.unit ? " " + f.unit : ""}</td>`,
    )}</tr>
`,
  );
  const sb = platform.sandbox;
  return layout(
    "Vertal Run: plans and limits",
    html`<h1>Plans and limits</h1>
<p>Each API key belongs to a plan. These are the built-in plans of the server this site
fronts; a self-hosted server may change them in its config file.</p>
<div class="scroll"><table class="plans">
<thead><tr><th scope="col">plan</th>${fields.map((f) => html`<th scope="col">${f.label}</th>`)}</tr></thead>
<tbody>
${rows}</tbody>
</table></div>
<h2>Every plan</h2>
<ul class="sandbox">
<li data-field="cpus" data-value="${sb.cpus}">${sb.cpus} CPU per sandbox</li>
<li data-field="processes" data-value="${sb.processes}">${sb.processes} processes</li>
<li data-field="tmp_mib" data-value="${sb.tmp_mib}">${sb.tmp_mib} MiB writable /tmp</li>
<li data-field="file_size_mib" data-value="${sb.file_size_mib}">${sb.file_size_mib} MiB largest file</li>
<li data-field="output_kib" data-value="${sb.output_kib}">${sb.output_kib} KiB of output per stream</li>
<li>No network access</li>
</ul>
<p>Over the rate limit a call gets <code>429 rate_limited</code>; over the daily quota,
<code>429 quota_exceeded</code> until midnight UTC. <a href="/docs/api">API reference</a></p>`,
  );
}

export function notFoundPage(path) {
  return layout(
    "Not found",
    html`<h1>Not found</h1>
<p>There is no page at <code>${path}</code>. Try <a href="/">the start page</a> or <a href="/docs/">the docs</a>.</p>`,
  );
}

export function unavailablePage() {
  return layout(
    "Docs unavailable",
    html`<h1>The docs are unavailable right now</h1>
<p>They are served by the API server, which this edge cannot reach at the moment. Try again shortly.</p>`,
  );
}
