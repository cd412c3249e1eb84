// Vertal Run's edge Worker (module syntax). It serves the site's own pages,
// takes the docs and the playground from the origin, and relays /api/* to
// the origin with the edge secret. See README.md for the routes and why the
// docs are proxied rather than copied.
import { fromOrigin, relay } from "./relay.js";
import { landingPage, notFoundPage, pricingPage, securityHeaders, unavailablePage } from "./pages.js";
import { STYLE } from "./style.js";

function page(status, body, cache = "public, max-age=300") {
  return new Response(body, { status, headers: { ...securityHeaders("text/html; charset=utf-8"), "Cache-Control": cache } });
}

// Paths the origin renders for the browser, and the origin path of each.
function originPagePath(path) {
  if (path === "/docs" || path.startsWith("/docs/") || path.startsWith("/assets/")) return path;
  if (path === "/playground") return "/";
  return null;
}

export default {
  async fetch(request, env) {
    const url = new URL(request.url);
    const path = url.pathname;
    if (path === "/api" || path.startsWith("/api/")) return relay(request, env);

    const get = request.method === "GET" || request.method === "HEAD";
    const originPath = originPagePath(path);
    if (!get) {
      const allow = { Allow: "GET, HEAD" };
      return new Response("method not allowed\n", { status: 405, headers: { ...securityHeaders("text/plain; charset=utf-8"), ...allow } });
    }
    if (originPath !== null) {
      const resp = await fromOrigin(request, env, originPath);
      return resp ?? page(503, unavailablePage(), "no-store");
    }
    switch (path) {
      case "/":
        return page(200, landingPage());
      case "/pricing":
        return page(200, pricingPage());
      case "/_site/style.css":
        return new Response(STYLE, {
          headers: { ...securityHeaders("text/css; charset=utf-8"), "Cache-Control": "public, max-age=31536000, immutable" },
        });
      case "/health":
        return new Response("ok\n", { headers: { ...securityHeaders("text/plain; charset=utf-8"), "Cache-Control": "no-store" } });
      default:
        return page(404, notFoundPage(path), "no-store");
    }
  },
};
