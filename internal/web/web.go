// Package web serves the browser side of Vertal Run: the playground at "/"
// and the documentation pages under "/docs/".
//
// Everything the pages need (HTML templates, script, style sheet, icon, and
// the Markdown docs) is embedded in the binary, so a server with no Internet
// access serves a complete site. Pages are rendered once, when the handler is
// built, from the Markdown in the repository's docs/ directory and from the
// OpenAPI document the API publishes, so the site cannot drift from either.
//
// The pages run under a strict Content-Security-Policy: scripts and styles
// only from this origin, no inline code, no outside resources, and Trusted
// Types, so the browser itself refuses any attempt to turn a string into
// markup. Program output in the playground is untrusted and only ever set
// as text.
package web

import (
	"bytes"
	"crypto/sha256"
	"embed"
	"encoding/base64"
	"encoding/hex"
	"fmt"
	"html"
	"html/template"
	"io"
	"io/fs"
	"log/slog"
	"mime"
	"net/http"
	"path"
	"regexp"
	"sort"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/kuboprotocol/vertal2kubo/docs"
	"github.com/kuboprotocol/vertal2kubo/internal/lang"
)

//go:embed assets templates
var embedded embed.FS

// Options configure the web handler. The zero value serves the playground and
// the embedded docs, without an API reference page.
type Options struct {
	// OpenAPI is the OpenAPI 3.1 document the API serves at
	// /v1/openapi.json; the API reference page is rendered from it. When
	// empty, the reference page is left out.
	OpenAPI []byte
	// Version is the server's version, shown in the page footer.
	Version string
	// APIBase is the path the browser reaches the API on, and the base URL
	// the snippets show after the page's origin. Default "/api".
	APIBase string
	// Docs holds the Markdown documentation (*.md at its root). Nil means
	// the repository's docs/ directory embedded in the binary.
	Docs fs.FS
	// RepoURL is where relative links in the docs to files that are not
	// docs pages (source files, the README) point. Default the project's
	// GitHub repository.
	RepoURL string
	// NotFound answers requests for paths this handler does not serve and
	// for methods other than GET and HEAD, so the API can keep one error
	// shape. Nil means a plain HTML 404 page (405 for other methods).
	NotFound http.Handler
	// Logger receives rendering problems (e.g. an OpenAPI document that does
	// not parse). Nil discards them.
	Logger *slog.Logger
	// Accounts says the server has accounts (sign-up, sign-in, dashboard):
	// the header of the playground and the docs then links to them. The
	// pages are rendered once, so the link cannot know who is signed in; it
	// goes to /login, which sends a signed-in browser on to /dashboard.
	Accounts bool
}

// DefaultRepoURL is the project's public repository.
const DefaultRepoURL = "https://github.com/kuboprotocol/Vertal2Kubo"

// ContentSecurityPolicy is sent with every page and asset. It allows
// nothing but this origin's own script, style and images, data: images for
// the icon and blob: images for the raster images a run returned (the
// playground makes those from bytes it sniffed; blob: URLs are only ever
// made by this origin's own script); no inline code, plugins, frames,
// forms or base-URL changes.
// require-trusted-types-for makes the browser reject assignments of plain
// strings to innerHTML and similar sinks, so output can only become text.
const ContentSecurityPolicy = "default-src 'none'; script-src 'self'; style-src 'self'; " +
	"connect-src 'self'; img-src 'self' data: blob:; base-uri 'none'; form-action 'none'; " +
	"frame-ancestors 'none'; require-trusted-types-for 'script'; trusted-types 'none'"

// NotebookContentSecurityPolicy is the notebook's: the same, and frames
// loaded from blob: URLs, which only this origin's script can make. The
// notebook shows a cell's HTML result (a DataFrame's table) in such a
// frame, sandboxed with nothing allowed: an opaque origin, no script, no
// forms, no navigation of the page. The frame's document inherits this
// policy too, so its script is refused twice.
//
// Its one other change lets the frame's document have exactly one inline
// stylesheet, ours (assets/frame.css, allowed by its hash), so a table is
// readable; a result's own <style> is still refused.
var NotebookContentSecurityPolicy = strings.Replace(ContentSecurityPolicy, "style-src 'self';",
	"style-src 'self' '"+FrameStyleHash+"';", 1) + "; frame-src blob:"

// FrameStyleHash is the CSP hash source of assets/frame.css, which the
// notebook puts, as it is, in a <style> of each HTML result's frame.
var FrameStyleHash = func() string {
	b, err := fs.ReadFile(embedded, "assets/frame.css")
	if err != nil {
		panic(fmt.Sprintf("web: reading embedded frame.css: %v", err)) // the build embeds it
	}
	sum := sha256.Sum256(b)
	return "sha256-" + base64.StdEncoding.EncodeToString(sum[:])
}()

// SecurityHeaders sets the headers every page and asset carries. The API
// may call it for its own responses too: the policy also suits JSON.
func SecurityHeaders(h http.Header) {
	h.Set("Content-Security-Policy", ContentSecurityPolicy)
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("Referrer-Policy", "no-referrer")
	h.Set("X-Frame-Options", "DENY")
	h.Set("Cross-Origin-Opener-Policy", "same-origin")
	h.Set("Cross-Origin-Resource-Policy", "same-origin")
	h.Set("Permissions-Policy", "camera=(), microphone=(), geolocation=(), payment=(), usb=()")
}

// asset is one embedded static file.
type asset struct {
	body        []byte
	contentType string
	hash        string // first 16 hex of the SHA-256, for ETag and cache busting
}

// page is one documentation page.
type page struct {
	Slug     string
	Title    string
	NavTitle string // the title up to a colon or dash, for the side menu
	Summary  string
	Source   string // repository path of the Markdown, "" for generated pages
	HTML     template.HTML
	TOC      []heading
	Ops      []operation
}

type site struct {
	opts     Options
	log      *slog.Logger
	assets   map[string]asset
	tmpl     *template.Template
	pages    map[string]*page
	nav      []*page
	rendered map[string][]byte // URL path -> finished HTML
	notFound []byte
}

// Handler returns the web handler. Mount it at "/": it serves "/" (the
// playground), "/assets/" (script, style, icon) and "/docs/" (the docs), and
// hands every other path and method to Options.NotFound.
func Handler(opts Options) http.Handler {
	if opts.APIBase == "" {
		opts.APIBase = "/api"
	}
	opts.APIBase = "/" + strings.Trim(opts.APIBase, "/")
	if opts.APIBase == "/" {
		opts.APIBase = ""
	}
	if opts.Docs == nil {
		opts.Docs = docs.FS()
	}
	if opts.RepoURL == "" {
		opts.RepoURL = DefaultRepoURL
	}
	s := &site{opts: opts, log: opts.Logger, pages: map[string]*page{}, rendered: map[string][]byte{}}
	if s.log == nil {
		s.log = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	s.loadAssets()
	s.tmpl = template.Must(template.New("").Funcs(template.FuncMap{"asset": s.assetURL, "lower": strings.ToLower}).ParseFS(embedded, "templates/*.html"))
	s.loadDocs()
	s.renderAll()
	return s
}

func (s *site) loadAssets() {
	s.assets = map[string]asset{}
	entries, err := fs.ReadDir(embedded, "assets")
	if err != nil {
		panic(fmt.Sprintf("web: reading embedded assets: %v", err)) // the build embeds them
	}
	for _, e := range entries {
		body, err := fs.ReadFile(embedded, "assets/"+e.Name())
		if err != nil {
			panic(fmt.Sprintf("web: reading embedded asset %s: %v", e.Name(), err))
		}
		sum := sha256.Sum256(body)
		ct := mime.TypeByExtension(path.Ext(e.Name()))
		switch path.Ext(e.Name()) { // don't depend on the host's mime.types
		case ".js":
			ct = "text/javascript; charset=utf-8"
		case ".css":
			ct = "text/css; charset=utf-8"
		case ".svg":
			ct = "image/svg+xml"
		case ".webmanifest":
			ct = "application/manifest+json"
		}
		s.assets[e.Name()] = asset{body: body, contentType: ct, hash: hex.EncodeToString(sum[:8])}
	}
}

// assetURL names an asset with its content hash, so browsers may cache it
// for good and still pick up a new build at once.
func (s *site) assetURL(name string) string {
	a, ok := s.assets[name]
	if !ok {
		panic(fmt.Sprintf("web: template refers to unknown asset %q", name))
	}
	return "/assets/" + name + "?v=" + a.hash
}

// docOrder puts the pages a newcomer needs first; other Markdown files
// follow in name order.
var docOrder = []string{"quickstart", "clients", "api", "reference", "security", "architecture"}

var reFirstPara = regexp.MustCompile(`(?s)<p>(.*?)</p>`)

func (s *site) loadDocs() {
	names, err := fs.Glob(s.opts.Docs, "*.md")
	if err != nil {
		s.log.Error("web: listing docs", "err", err)
	}
	known := map[string]string{} // upper-case file name -> slug
	for _, n := range names {
		known[strings.ToUpper(n)] = docSlug(n)
	}
	resolve := func(dest string) (string, bool) { return s.resolveLink(dest, known) }
	for _, n := range names {
		src, err := fs.ReadFile(s.opts.Docs, n)
		if err != nil {
			s.log.Error("web: reading doc", "file", n, "err", err)
			continue
		}
		d := renderMarkdown(string(src), resolve)
		p := &page{Slug: docSlug(n), Title: d.Title, Source: "docs/" + n, HTML: d.HTML}
		if p.Title == "" {
			p.Title = strings.TrimSuffix(n, ".md")
		}
		p.NavTitle = navTitle(p.Title)
		for _, h := range d.Headings {
			if h.Level == 2 {
				p.TOC = append(p.TOC, h)
			}
		}
		if m := reFirstPara.FindStringSubmatch(string(d.HTML)); m != nil {
			p.Summary = summarize(m[1])
		}
		s.pages[p.Slug] = p
	}
	if len(s.opts.OpenAPI) > 0 {
		md := func(src string) template.HTML { return renderMarkdown(src, resolve).HTML }
		ref, err := renderReference(s.opts.OpenAPI, s.opts.APIBase, md)
		p := &page{Slug: "reference", Title: "OpenAPI reference", NavTitle: "OpenAPI reference", Summary: "Every endpoint, field and header, generated from the OpenAPI document this server publishes."}
		if err != nil {
			s.log.Error("web: rendering the API reference", "err", err)
			p.HTML = template.HTML(`<h1>API reference</h1><p>The OpenAPI document could not be rendered. It is served as JSON at <a href="` +
				esc(s.opts.APIBase) + `/v1/openapi.json"><code>` + esc(s.opts.APIBase) + `/v1/openapi.json</code></a>.</p>`)
		} else {
			p.HTML, p.Ops = ref.HTML, ref.Ops
		}
		if _, clash := s.pages["reference"]; clash {
			s.log.Warn("web: docs/REFERENCE.md is shadowed by the generated API reference")
		}
		s.pages["reference"] = p
	}
	rank := map[string]int{}
	for i, slug := range docOrder {
		rank[slug] = i + 1
	}
	for _, p := range s.pages {
		s.nav = append(s.nav, p)
	}
	sort.Slice(s.nav, func(i, j int) bool {
		ri, rj := rank[s.nav[i].Slug], rank[s.nav[j].Slug]
		if ri == 0 {
			ri = len(docOrder) + 1
		}
		if rj == 0 {
			rj = len(docOrder) + 1
		}
		if ri != rj {
			return ri < rj
		}
		return s.nav[i].Slug < s.nav[j].Slug
	})
}

// docSlug is a file's page name: "SECURITY.md" is /docs/security.
func docSlug(name string) string {
	return strings.ToLower(strings.TrimSuffix(name, path.Ext(name)))
}

// navTitle shortens "Clients: Go SDK, CLI and MCP" to "Clients".
func navTitle(title string) string {
	for _, sep := range []string{": ", " — ", " – ", " - "} {
		if i := strings.Index(title, sep); i > 0 {
			return title[:i]
		}
	}
	return title
}

// summarize turns a rendered paragraph into plain text of at most ~150
// characters, for the docs index.
func summarize(htmlText string) string {
	t := strings.Join(strings.Fields(htmlUnescape(reTags.ReplaceAllString(htmlText, ""))), " ")
	if len(t) <= 150 {
		return t
	}
	cut := strings.LastIndex(t[:150], " ")
	if cut < 80 {
		cut = 150
		for cut > 0 && !utf8.RuneStart(t[cut]) {
			cut--
		}
	}
	return strings.TrimRight(t[:cut], ",;:") + "…"
}

// resolveLink maps a relative link in a doc to its page (SECURITY.md#keys
// -> /docs/security#keys), a site path, or the file in the repository.
func (s *site) resolveLink(dest string, known map[string]string) (string, bool) {
	if strings.HasPrefix(dest, "/") {
		return dest, true
	}
	target, frag := dest, ""
	if i := strings.IndexByte(dest, '#'); i >= 0 {
		target, frag = dest[:i], dest[i:]
	}
	if i := strings.IndexByte(target, '?'); i >= 0 {
		target = target[:i]
	}
	clean := path.Clean(path.Join("docs", target))
	if dir, file := path.Split(clean); dir == "docs/" {
		if slug, ok := known[strings.ToUpper(file)]; ok {
			return "/docs/" + slug + frag, true
		}
	}
	if clean == ".." || strings.HasPrefix(clean, "../") {
		return "", false
	}
	return strings.TrimRight(s.opts.RepoURL, "/") + "/blob/main/" + clean + frag, true
}

// pageData is what the templates see.
type pageData struct {
	Title    string
	Section  string // "playground", "notebook" or "docs", for the header's active link
	Version  string
	APIBase  string
	RepoURL  string
	Nav      []*page
	Page     *page
	HasDocs  bool
	Accounts bool
	Starters []starter
}

// starter is a language the playground offers, with its first program.
type starter struct {
	Name, Label string
}

// starters are the playground's languages, from package lang.
var starters = func() []starter {
	out := make([]starter, len(lang.All))
	for i, d := range lang.All {
		out[i] = starter{d.Name, d.Label}
	}
	return out
}()

func (s *site) data(section, title string) pageData {
	return pageData{
		Title: title, Section: section, Version: s.opts.Version, APIBase: s.opts.APIBase,
		RepoURL: s.opts.RepoURL, Nav: s.nav, HasDocs: len(s.nav) > 0,
		Accounts: s.opts.Accounts, Starters: starters,
	}
}

func (s *site) render(name string, d pageData) []byte {
	var b bytes.Buffer
	if err := s.tmpl.ExecuteTemplate(&b, name, d); err != nil {
		panic(fmt.Sprintf("web: rendering %s: %v", name, err)) // templates are fixed at build time; tests render them all
	}
	return b.Bytes()
}

func (s *site) renderAll() {
	s.rendered["/"] = s.render("playground.html", s.data("playground", "Playground"))
	s.rendered["/notebook"] = s.render("notebook.html", s.data("notebook", "Notebook"))
	idx := s.data("docs", "Documentation")
	s.rendered["/docs/"] = s.render("docs_index.html", idx)
	for slug, p := range s.pages {
		d := s.data("docs", p.Title)
		d.Page = p
		s.rendered["/docs/"+slug] = s.render("doc.html", d)
	}
	s.notFound = s.render("notfound.html", s.data("", "Page not found"))
}

func (s *site) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	p := r.URL.Path
	owned := p == "/" || p == "/notebook" || p == "/docs" || strings.HasPrefix(p, "/docs/") || strings.HasPrefix(p, "/assets/") || p == "/favicon.ico"
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		if s.opts.NotFound != nil {
			s.opts.NotFound.ServeHTTP(w, r)
			return
		}
		SecurityHeaders(w.Header())
		w.Header().Set("Allow", "GET, HEAD")
		http.Error(w, "method not allowed", http.StatusMethodNotAllowed)
		return
	}
	if !owned && s.opts.NotFound != nil {
		s.opts.NotFound.ServeHTTP(w, r)
		return
	}
	SecurityHeaders(w.Header())
	switch {
	case p == "/docs":
		http.Redirect(w, r, "/docs/", http.StatusMovedPermanently)
		return
	case p == "/favicon.ico":
		s.serveAsset(w, r, "favicon.svg")
		return
	case strings.HasPrefix(p, "/assets/"):
		s.serveAsset(w, r, strings.TrimPrefix(p, "/assets/"))
		return
	}
	if len(p) > len("/docs/") && strings.HasSuffix(p, "/") { // /docs/quickstart/ -> /docs/quickstart
		if _, ok := s.rendered[strings.TrimSuffix(p, "/")]; ok {
			http.Redirect(w, r, strings.TrimSuffix(p, "/"), http.StatusMovedPermanently)
			return
		}
	}
	body, ok := s.rendered[p]
	if !ok {
		s.writeNotFound(w)
		return
	}
	h := w.Header()
	if p == "/notebook" {
		h.Set("Content-Security-Policy", NotebookContentSecurityPolicy)
	}
	h.Set("Content-Type", "text/html; charset=utf-8")
	h.Set("Cache-Control", "no-cache")
	etag := `"` + contentHash(body) + `"`
	h.Set("ETag", etag)
	http.ServeContent(w, r, "", time.Time{}, bytes.NewReader(body))
}

func (s *site) writeNotFound(w http.ResponseWriter) {
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.Header().Set("Cache-Control", "no-cache")
	w.WriteHeader(http.StatusNotFound)
	_, _ = w.Write(s.notFound)
}

func (s *site) serveAsset(w http.ResponseWriter, r *http.Request, name string) {
	a, ok := s.assets[name]
	if !ok {
		s.writeNotFound(w)
		return
	}
	h := w.Header()
	h.Set("Content-Type", a.contentType)
	h.Set("ETag", `"`+a.hash+`"`)
	if r.URL.Query().Get("v") == a.hash {
		h.Set("Cache-Control", "public, max-age=31536000, immutable")
	} else {
		h.Set("Cache-Control", "no-cache")
	}
	http.ServeContent(w, r, "", time.Time{}, bytes.NewReader(a.body))
}

func contentHash(b []byte) string {
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:8])
}

func htmlUnescape(s string) string { return html.UnescapeString(s) }
