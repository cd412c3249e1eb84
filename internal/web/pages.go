package web

import (
	"bytes"
	"html/template"
	"net/http"
	"strconv"
	"strings"
)

// AccountContentSecurityPolicy is ContentSecurityPolicy for the account
// pages (sign-in, sign-up, dashboard, operator): the same policy, except
// that forms may post to this origin, and only to it.
const AccountContentSecurityPolicy = "default-src 'none'; script-src 'self'; style-src 'self'; " +
	"connect-src 'self'; img-src 'self' data:; base-uri 'none'; form-action 'self'; " +
	"frame-ancestors 'none'; require-trusted-types-for 'script'; trusted-types 'none'"

// Pages renders the account pages with the site's layout and assets. Its
// templates are html/template, so every value (a name, an email) is
// escaped for where it lands.
type Pages struct {
	site *site
	tmpl *template.Template
}

// NewPages returns the account pages; opts as for Handler.
func NewPages(opts Options) *Pages {
	h := Handler(opts).(*site)
	t := template.Must(template.New("").Funcs(template.FuncMap{"asset": h.assetURL, "lower": strings.ToLower}).
		ParseFS(embedded, "templates/layout.html", "templates/account/*.html"))
	return &Pages{site: h, tmpl: t}
}

// Render writes page name with status, under AccountContentSecurityPolicy
// and no caching: a page may hold a new key or a CSRF token. d is the
// API's page data (api.Page): the layout reads Title, Section, Version,
// APIBase, RepoURL and HasDocs from it.
func (p *Pages) Render(w http.ResponseWriter, r *http.Request, status int, name string, d any) error {
	var b bytes.Buffer
	if err := p.tmpl.ExecuteTemplate(&b, name, d); err != nil {
		return err
	}
	h := w.Header()
	SecurityHeaders(h)
	h.Set("Content-Security-Policy", AccountContentSecurityPolicy)
	h.Set("Content-Type", "text/html; charset=utf-8")
	h.Set("Content-Length", strconv.Itoa(b.Len()))
	h.Set("Cache-Control", "no-store")
	w.WriteHeader(status)
	if r.Method != http.MethodHead {
		_, _ = w.Write(b.Bytes())
	}
	return nil
}
