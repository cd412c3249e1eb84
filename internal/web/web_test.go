package web

import (
	"crypto/sha256"
	"encoding/base64"
	"html"
	"io"
	"io/fs"
	"net/http"
	"net/http/httptest"
	"os"
	"regexp"
	"strings"
	"testing"
	"testing/fstest"

	"github.com/google/go-cmp/cmp"

	"github.com/kuboprotocol/vertal2kubo/internal/api"
)

func testOpenAPI(t *testing.T) []byte {
	t.Helper()
	b, err := os.ReadFile("testdata/openapi.json")
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func testDocs() fstest.MapFS {
	return fstest.MapFS{
		"QUICKSTART.md":   {Data: []byte("# Quickstart\n\nStart the server and open the [playground](/). See [security](SECURITY.md#keys).\n\n## Keys\n\nText.")},
		"SECURITY.md":     {Data: []byte("# Security model\n\n## Keys\n\nHashed. <script>alert(1)</script>")},
		"ARCHITECTURE.md": {Data: []byte("# Architecture\n\nSee [the engine](../internal/engine/engine.go).")},
	}
}

func get(t *testing.T, h http.Handler, method, target string) (*http.Response, string) {
	t.Helper()
	req := httptest.NewRequest(method, target, nil)
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	resp := rec.Result()
	body, _ := io.ReadAll(resp.Body)
	return resp, string(body)
}

func TestPagesAndHeaders(t *testing.T) {
	h := Handler(Options{OpenAPI: testOpenAPI(t), Version: "1.2.3", Docs: testDocs()})
	for _, tc := range []struct {
		path        string
		status      int
		contentType string
		contains    []string
	}{
		{"/", 200, "text/html; charset=utf-8", []string{`data-api-base="/api"`, `id="run"`, `id="key"`, "v1.2.3"}},
		{"/notebook", 200, "text/html; charset=utf-8", []string{`id="cells"`, `id="cell-template"`, `id="key"`, `/assets/common.js`, `/assets/notebook.js`, `href="/notebook" aria-current="page"`}},
		{"/assets/notebook.js", 200, "text/javascript; charset=utf-8", nil},
		{"/assets/common.js", 200, "text/javascript; charset=utf-8", nil},
		{"/docs/", 200, "text/html; charset=utf-8", []string{`href="/docs/quickstart"`, `href="/docs/reference"`, `href="/docs/security"`}},
		{"/docs/quickstart", 200, "text/html; charset=utf-8", []string{`<h1 id="quickstart">Quickstart</h1>`, `href="/docs/security#keys"`, `href="#keys"`}},
		{"/docs/security", 200, "text/html; charset=utf-8", []string{"&lt;script&gt;alert(1)&lt;/script&gt;"}},
		{"/docs/architecture", 200, "text/html; charset=utf-8", []string{`href="https://github.com/kuboprotocol/Vertal2Kubo/blob/main/internal/engine/engine.go"`}},
		{"/docs/reference", 200, "text/html; charset=utf-8", []string{`id="op-runcode"`, "usage.sandbox_seconds", "Retry-After", "&lt;img src=x onerror=alert(1)&gt;"}},
		{"/docs/nope", 404, "text/html; charset=utf-8", []string{"Page not found"}},
		{"/assets/style.css", 200, "text/css; charset=utf-8", nil},
		{"/assets/playground.js", 200, "text/javascript; charset=utf-8", nil},
		{"/assets/docs.js", 200, "text/javascript; charset=utf-8", nil},
		{"/assets/favicon.svg", 200, "image/svg+xml", nil},
		{"/assets/missing.js", 404, "text/html; charset=utf-8", nil},
		{"/elsewhere", 404, "text/html; charset=utf-8", nil},
	} {
		t.Run(tc.path, func(t *testing.T) {
			resp, body := get(t, h, "GET", tc.path)
			if resp.StatusCode != tc.status {
				t.Fatalf("status = %d, want %d", resp.StatusCode, tc.status)
			}
			if got := resp.Header.Get("Content-Type"); got != tc.contentType {
				t.Errorf("Content-Type = %q, want %q", got, tc.contentType)
			}
			csp := ContentSecurityPolicy
			if tc.path == "/notebook" {
				// The notebook alone may frame blob: documents, for HTML
				// results in a sandboxed frame.
				csp = NotebookContentSecurityPolicy
			}
			want := map[string]string{
				"Content-Security-Policy": csp,
				"X-Content-Type-Options":  "nosniff",
				"Referrer-Policy":         "no-referrer",
				"X-Frame-Options":         "DENY",
			}
			got := map[string]string{}
			for k := range want {
				got[k] = resp.Header.Get(k)
			}
			if diff := cmp.Diff(want, got); diff != "" {
				t.Errorf("security headers (-want +got):\n%s", diff)
			}
			for _, s := range tc.contains {
				if !strings.Contains(body, s) {
					t.Errorf("body lacks %q", s)
				}
			}
		})
	}
}

func TestContentSecurityPolicyIsStrict(t *testing.T) {
	directives := map[string]string{}
	for _, d := range strings.Split(ContentSecurityPolicy, ";") {
		f := strings.Fields(d)
		if len(f) > 0 {
			directives[f[0]] = strings.Join(f[1:], " ")
		}
	}
	want := map[string]string{
		"default-src":               "'none'",
		"script-src":                "'self'",
		"style-src":                 "'self'",
		"connect-src":               "'self'",
		"img-src":                   "'self' data: blob:",
		"base-uri":                  "'none'",
		"form-action":               "'none'",
		"frame-ancestors":           "'none'",
		"require-trusted-types-for": "'script'",
		"trusted-types":             "'none'",
	}
	if diff := cmp.Diff(want, directives); diff != "" {
		t.Errorf("CSP directives (-want +got):\n%s", diff)
	}
	// The notebook's adds frames from blob: (which only the page's own
	// script can make) and changes nothing else.
	// and one inline stylesheet by its hash: the frames' own, frame.css.
	css, err := fs.ReadFile(embedded, "assets/frame.css")
	if err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(css)
	hash := "'sha256-" + base64.StdEncoding.EncodeToString(sum[:]) + "'"
	wantNB := strings.Replace(ContentSecurityPolicy, "style-src 'self';", "style-src 'self' "+hash+";", 1) + "; frame-src blob:"
	if NotebookContentSecurityPolicy != wantNB || !strings.Contains(wantNB, hash) {
		t.Errorf("the notebook's CSP is\n%s\nwant the default with only frame-src blob: and frame.css's hash:\n%s", NotebookContentSecurityPolicy, wantNB)
	}
}

// TestPagesHaveNoInlineCode checks what the CSP would otherwise reject in
// the browser: inline scripts, style elements and attributes, event handler
// attributes, and resources from other origins.
func TestPagesHaveNoInlineCode(t *testing.T) {
	h := Handler(Options{OpenAPI: testOpenAPI(t), Docs: testDocs()})
	reScript := regexp.MustCompile(`(?is)<script\b([^>]*)>(.*?)</script>`)
	reHandler := regexp.MustCompile(`(?i)<[^>]*\son[a-z]+\s*=`)
	reSrc := regexp.MustCompile(`(?i)\s(?:src|href)="([^"]*)"`)
	for _, path := range []string{"/", "/notebook", "/docs/", "/docs/quickstart", "/docs/security", "/docs/architecture", "/docs/reference", "/nope"} {
		_, body := get(t, h, "GET", path)
		for _, m := range reScript.FindAllStringSubmatch(body, -1) {
			if !strings.Contains(m[1], `src="/assets/`) || strings.TrimSpace(m[2]) != "" {
				t.Errorf("%s: inline or foreign script: %s", path, m[0])
			}
		}
		if strings.Contains(strings.ToLower(body), "<style") || strings.Contains(strings.ToLower(body), " style=") {
			t.Errorf("%s: inline style", path)
		}
		if m := reHandler.FindString(body); m != "" {
			t.Errorf("%s: event handler attribute: %s", path, m)
		}
		for _, m := range reSrc.FindAllStringSubmatch(body, -1) {
			u := m[1]
			if strings.HasPrefix(u, "/assets/") {
				resp, _ := get(t, h, "GET", u)
				if resp.StatusCode != 200 {
					t.Errorf("%s: asset %s is %d", path, u, resp.StatusCode)
				}
			}
			if strings.HasPrefix(u, "/docs/") {
				target := strings.SplitN(u, "#", 2)[0]
				if resp, _ := get(t, h, "GET", target); resp.StatusCode != 200 {
					t.Errorf("%s: broken link %s (%d)", path, u, resp.StatusCode)
				}
			}
		}
		if strings.Contains(body, `src="http`) || strings.Contains(body, `href="//`) {
			t.Errorf("%s: refers to an outside resource", path)
		}
	}
}

func TestNotFoundAndMethodsGoToTheAPI(t *testing.T) {
	var hits []string
	notFound := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hits = append(hits, r.Method+" "+r.URL.Path)
		w.WriteHeader(http.StatusTeapot)
	})
	h := Handler(Options{Docs: testDocs(), NotFound: notFound})
	for _, tc := range []struct {
		method, path string
		status       int
	}{
		{"GET", "/", 200},
		{"HEAD", "/docs/quickstart", 200},
		{"GET", "/v2/unknown", http.StatusTeapot},
		{"POST", "/", http.StatusTeapot},
		{"DELETE", "/docs/quickstart", http.StatusTeapot},
		{"GET", "/docs/unknown", 404},   // a browser path: the HTML 404 page
		{"GET", "/docs/reference", 404}, // no OpenAPI document given
	} {
		resp, _ := get(t, h, tc.method, tc.path)
		if resp.StatusCode != tc.status {
			t.Errorf("%s %s = %d, want %d", tc.method, tc.path, resp.StatusCode, tc.status)
		}
	}
	want := []string{"GET /v2/unknown", "POST /", "DELETE /docs/quickstart"}
	if diff := cmp.Diff(want, hits); diff != "" {
		t.Errorf("NotFound calls (-want +got):\n%s", diff)
	}
}

func TestRedirectsAndCaching(t *testing.T) {
	h := Handler(Options{Docs: testDocs()})
	resp, _ := get(t, h, "GET", "/docs")
	if resp.StatusCode != http.StatusMovedPermanently || resp.Header.Get("Location") != "/docs/" {
		t.Errorf("/docs = %d %q, want 301 /docs/", resp.StatusCode, resp.Header.Get("Location"))
	}
	resp, _ = get(t, h, "GET", "/docs/quickstart/")
	if resp.StatusCode != http.StatusMovedPermanently || resp.Header.Get("Location") != "/docs/quickstart" {
		t.Errorf("/docs/quickstart/ = %d %q", resp.StatusCode, resp.Header.Get("Location"))
	}

	_, page := get(t, h, "GET", "/")
	m := regexp.MustCompile(`/assets/playground\.js\?v=([0-9a-f]+)`).FindStringSubmatch(page)
	if m == nil {
		t.Fatal("playground does not load a versioned playground.js")
	}
	resp, _ = get(t, h, "GET", m[0])
	if got := resp.Header.Get("Cache-Control"); got != "public, max-age=31536000, immutable" {
		t.Errorf("versioned asset Cache-Control = %q", got)
	}
	resp, _ = get(t, h, "GET", "/assets/playground.js?v=old")
	if got := resp.Header.Get("Cache-Control"); got != "no-cache" {
		t.Errorf("stale asset Cache-Control = %q, want no-cache", got)
	}
	req := httptest.NewRequest("GET", "/", nil)
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	req = httptest.NewRequest("GET", "/", nil)
	req.Header.Set("If-None-Match", rec.Header().Get("ETag"))
	rec = httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	if rec.Code != http.StatusNotModified {
		t.Errorf("conditional GET / = %d, want 304", rec.Code)
	}
}

func TestAPIBase(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{"", `data-api-base="/api"`},
		{"/api/", `data-api-base="/api"`},
		{"v1root", `data-api-base="/v1root"`},
		{"/", `data-api-base=""`},
	} {
		_, body := get(t, Handler(Options{APIBase: tc.in, Docs: testDocs()}), "GET", "/")
		if !strings.Contains(body, tc.want) {
			t.Errorf("APIBase %q: page lacks %s", tc.in, tc.want)
		}
	}
}

// TestAccountLink: with accounts, the playground and every docs page link
// to the account pages; without, none does.
func TestAccountLink(t *testing.T) {
	const link = `<a href="/login">Account</a>`
	for _, accounts := range []bool{true, false} {
		h := Handler(Options{Docs: testDocs(), Accounts: accounts})
		for _, path := range []string{"/", "/docs/"} {
			_, body := get(t, h, "GET", path)
			if got := strings.Contains(body, link); got != accounts {
				t.Errorf("accounts %v: %s has the account link: %v", accounts, path, got)
			}
		}
	}
}

// TestEmbeddedDocsLinks renders the repository's docs and follows every
// link between pages: the page must exist and so must the anchor. The
// reference page is the API's own document, as the server serves it, so
// that a link into it (/docs/reference#webhooks) is checked against what
// readers see.
func TestEmbeddedDocsLinks(t *testing.T) {
	doc, err := api.OpenAPIDocument("test", "/api")
	if err != nil {
		t.Fatal(err)
	}
	h := Handler(Options{OpenAPI: doc})
	reHref := regexp.MustCompile(`href="([^"]*)"`)
	reID := regexp.MustCompile(`id="([^"]*)"`)
	ids := func(body string) map[string]bool {
		out := map[string]bool{}
		for _, m := range reID.FindAllStringSubmatch(body, -1) {
			out[m[1]] = true
		}
		return out
	}
	_, index := get(t, h, "GET", "/docs/")
	pages := regexp.MustCompile(`href="(/docs/[a-z0-9_-]+)"`).FindAllStringSubmatch(index, -1)
	if len(pages) < 3 {
		t.Fatalf("docs index lists %d pages, want the quickstart, the architecture and the reference at least", len(pages))
	}
	for _, p := range pages {
		resp, body := get(t, h, "GET", p[1])
		if resp.StatusCode != 200 || strings.Count(body, "<h1") != 1 {
			t.Errorf("%s: status %d, %d h1", p[1], resp.StatusCode, strings.Count(body, "<h1"))
			continue
		}
		for _, m := range reHref.FindAllStringSubmatch(body, -1) {
			href := html.UnescapeString(m[1])
			path, frag, _ := strings.Cut(href, "#")
			switch {
			case path == "" && frag != "":
				if !ids(body)[frag] {
					t.Errorf("%s: anchor #%s has no target", p[1], frag)
				}
			case strings.HasPrefix(path, "/docs/"):
				resp, target := get(t, h, "GET", path)
				if resp.StatusCode != 200 {
					t.Errorf("%s: link to %s is %d", p[1], path, resp.StatusCode)
				} else if frag != "" && !ids(target)[frag] {
					t.Errorf("%s: link to %s#%s: no such anchor", p[1], path, frag)
				}
			}
		}
	}
}

func TestBadOpenAPIStillServes(t *testing.T) {
	h := Handler(Options{OpenAPI: []byte("{not json"), Docs: testDocs()})
	resp, body := get(t, h, "GET", "/docs/reference")
	if resp.StatusCode != 200 || !strings.Contains(body, "/api/v1/openapi.json") {
		t.Errorf("reference with a broken document = %d, want 200 with a link to the JSON", resp.StatusCode)
	}
}
