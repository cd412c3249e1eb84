package web

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"html"
	"html/template"
	"regexp"
	"sort"
	"strconv"
	"strings"
)

// This file renders the API reference page from the OpenAPI 3.1 document
// the server publishes, so the page can never drift from /v1/openapi.json.
// It reads the subset of OpenAPI the API uses (paths, operations,
// parameters, JSON bodies, responses with headers, component schemas,
// local $refs, and the webhooks the server sends) and escapes every string
// it takes from the document.

// ordered is a JSON object that remembers the order of its keys, so the
// reference lists routes and fields in the order the document gives them.
type ordered[T any] struct {
	Keys   []string
	Values map[string]T
}

func (o *ordered[T]) UnmarshalJSON(b []byte) error {
	dec := json.NewDecoder(bytes.NewReader(b))
	tok, err := dec.Token()
	if err != nil {
		return err
	}
	if d, ok := tok.(json.Delim); !ok || d != '{' {
		return errors.New("expected a JSON object")
	}
	o.Values = map[string]T{}
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return err
		}
		key, _ := tok.(string)
		var v T
		if err := dec.Decode(&v); err != nil {
			return fmt.Errorf("decoding %q: %w", key, err)
		}
		if _, dup := o.Values[key]; !dup {
			o.Keys = append(o.Keys, key)
		}
		o.Values[key] = v
	}
	return nil
}

type oaDoc struct {
	OpenAPI string `json:"openapi"`
	Info    struct {
		Title       string `json:"title"`
		Version     string `json:"version"`
		Description string `json:"description"`
	} `json:"info"`
	Servers []struct {
		URL         string `json:"url"`
		Description string `json:"description"`
	} `json:"servers"`
	Security []map[string][]string             `json:"security"`
	Paths    ordered[ordered[json.RawMessage]] `json:"paths"`
	// Webhooks are the requests the server sends (OpenAPI 3.1), by name.
	Webhooks   ordered[ordered[json.RawMessage]] `json:"webhooks"`
	Components struct {
		Schemas         ordered[*oaSchema]   `json:"schemas"`
		Responses       map[string]*oaResp   `json:"responses"`
		Parameters      map[string]*oaParam  `json:"parameters"`
		Headers         map[string]*oaHeader `json:"headers"`
		RequestBodies   map[string]*oaBody   `json:"requestBodies"`
		SecuritySchemes ordered[struct {
			Type         string `json:"type"`
			Scheme       string `json:"scheme"`
			BearerFormat string `json:"bearerFormat"`
			Description  string `json:"description"`
		}] `json:"securitySchemes"`
	} `json:"components"`
}

type oaOp struct {
	OperationID string                 `json:"operationId"`
	Summary     string                 `json:"summary"`
	Description string                 `json:"description"`
	Tags        []string               `json:"tags"`
	Parameters  []*oaParam             `json:"parameters"`
	RequestBody *oaBody                `json:"requestBody"`
	Responses   ordered[*oaResp]       `json:"responses"`
	Security    *[]map[string][]string `json:"security"`
	Deprecated  bool                   `json:"deprecated"`
}

type oaParam struct {
	Ref         string    `json:"$ref"`
	Name        string    `json:"name"`
	In          string    `json:"in"`
	Description string    `json:"description"`
	Required    bool      `json:"required"`
	Schema      *oaSchema `json:"schema"`
}

type oaHeader struct {
	Ref         string    `json:"$ref"`
	Description string    `json:"description"`
	Schema      *oaSchema `json:"schema"`
}

type oaMedia struct {
	Schema   *oaSchema       `json:"schema"`
	Example  json.RawMessage `json:"example"`
	Examples ordered[struct {
		Summary string          `json:"summary"`
		Value   json.RawMessage `json:"value"`
	}] `json:"examples"`
}

type oaBody struct {
	Ref         string           `json:"$ref"`
	Description string           `json:"description"`
	Required    bool             `json:"required"`
	Content     ordered[oaMedia] `json:"content"`
}

type oaResp struct {
	Ref         string             `json:"$ref"`
	Description string             `json:"description"`
	Headers     ordered[*oaHeader] `json:"headers"`
	Content     ordered[oaMedia]   `json:"content"`
}

type oaSchema struct {
	Ref                  string             `json:"$ref"`
	Type                 json.RawMessage    `json:"type"` // a string, or a list in 3.1
	Format               string             `json:"format"`
	Title                string             `json:"title"`
	Description          string             `json:"description"`
	Properties           ordered[*oaSchema] `json:"properties"`
	Required             []string           `json:"required"`
	Items                *oaSchema          `json:"items"`
	Enum                 []json.RawMessage  `json:"enum"`
	Const                json.RawMessage    `json:"const"`
	OneOf                []*oaSchema        `json:"oneOf"`
	AnyOf                []*oaSchema        `json:"anyOf"`
	AllOf                []*oaSchema        `json:"allOf"`
	Minimum              *float64           `json:"minimum"`
	Maximum              *float64           `json:"maximum"`
	MinLength            *int               `json:"minLength"`
	MaxLength            *int               `json:"maxLength"`
	Pattern              string             `json:"pattern"`
	Default              json.RawMessage    `json:"default"`
	Example              json.RawMessage    `json:"example"`
	Examples             []json.RawMessage  `json:"examples"`
	AdditionalProperties json.RawMessage    `json:"additionalProperties"`
}

// operation is one route and method, ready to render. For a webhook,
// Path is the webhook's name and Webhook is set.
type operation struct {
	Method, Path, ID string
	Op               *oaOp
	Webhook          bool
}

var methodOrder = []string{"get", "post", "put", "patch", "delete", "head", "options"}

// reference is the rendered API reference.
type reference struct {
	Title   string
	Version string
	HTML    template.HTML
	Ops     []operation // for the page's side navigation
}

// renderReference renders an OpenAPI document. apiBase is the path prefix the
// server answers the API on ("/api"), shown as the base URL.
func renderReference(raw []byte, apiBase string, md func(string) template.HTML) (reference, error) {
	var doc oaDoc
	if err := json.Unmarshal(raw, &doc); err != nil {
		return reference{}, fmt.Errorf("parsing the OpenAPI document: %w", err)
	}
	r := &refRenderer{doc: &doc, md: md}
	ops, err := operations(doc.Paths, "op-", false)
	if err != nil {
		return reference{}, err
	}
	hooks, err := operations(doc.Webhooks, "webhook-", true)
	if err != nil {
		return reference{}, err
	}

	b := &r.b
	b.WriteString(`<header class="ref-intro">`)
	b.WriteString("<h1>" + esc(orDefault(doc.Info.Title, "API reference")) + "</h1>\n")
	if doc.Info.Version != "" {
		b.WriteString(`<p class="muted">Version ` + esc(doc.Info.Version) + ` · OpenAPI ` + esc(doc.OpenAPI) + "</p>\n")
	}
	if doc.Info.Description != "" {
		b.WriteString(string(md(doc.Info.Description)))
	}
	b.WriteString(`<dl class="facts">`)
	b.WriteString(`<dt>Base URL</dt><dd><code><span data-origin></span>` + esc(apiBase) + `</code></dd>`)
	b.WriteString(`<dt>Document</dt><dd><a href="` + esc(apiBase) + `/v1/openapi.json"><code>` + esc(apiBase) + `/v1/openapi.json</code></a></dd>`)
	for _, name := range doc.Components.SecuritySchemes.Keys {
		s := doc.Components.SecuritySchemes.Values[name]
		desc := s.Type
		if s.Scheme != "" {
			desc = s.Scheme
		}
		if strings.EqualFold(s.Scheme, "bearer") {
			desc = "Authorization: Bearer kubo_sk_…"
		}
		b.WriteString(`<dt>Authentication</dt><dd><code>` + esc(desc) + `</code>`)
		if s.Description != "" {
			b.WriteString(" " + esc(s.Description))
		}
		b.WriteString("</dd>")
	}
	b.WriteString("</dl></header>\n")

	for _, o := range ops {
		r.operation(o)
	}
	if len(hooks) > 0 {
		b.WriteString(`<section class="webhooks"><h2 id="webhooks">Webhooks</h2>` + "\n")
		b.WriteString("<p>Requests the server sends to a URL you give it, rather than answers to yours.</p>\n")
		for _, o := range hooks {
			r.operation(o)
		}
		b.WriteString("</section>\n")
	}
	if len(doc.Components.Schemas.Keys) > 0 {
		b.WriteString(`<section class="schemas"><h2 id="schemas">Schemas</h2>` + "\n")
		for _, name := range doc.Components.Schemas.Keys {
			s := doc.Components.Schemas.Values[name]
			b.WriteString(`<div class="schema" id="schema-` + esc(slug(name)) + `"><h3><code>` + esc(name) + "</code></h3>\n")
			if s != nil && s.Description != "" {
				b.WriteString(string(md(s.Description)))
			}
			r.fields(s)
			b.WriteString("</div>\n")
		}
		b.WriteString("</section>\n")
	}
	return reference{Title: orDefault(doc.Info.Title, "API reference"), Version: doc.Info.Version, HTML: template.HTML(b.String()), Ops: append(ops, hooks...)}, nil
}

// operations lists the operations of a paths (or webhooks) object in the
// document's order; ids get prefix.
func operations(items ordered[ordered[json.RawMessage]], prefix string, webhook bool) ([]operation, error) {
	var ops []operation
	for _, p := range items.Keys {
		item := items.Values[p]
		for _, method := range methodOrder {
			rawOp, ok := item.Values[method]
			if !ok {
				continue
			}
			op := new(oaOp)
			if err := json.Unmarshal(rawOp, op); err != nil {
				return nil, fmt.Errorf("parsing %s %s: %w", strings.ToUpper(method), p, err)
			}
			// Path-level parameters apply to every operation under the path.
			if rawParams, ok := item.Values["parameters"]; ok {
				var shared []*oaParam
				if err := json.Unmarshal(rawParams, &shared); err == nil {
					op.Parameters = append(shared, op.Parameters...)
				}
			}
			id := op.OperationID
			if id == "" {
				id = method + "-" + p
			}
			ops = append(ops, operation{Method: strings.ToUpper(method), Path: p, ID: prefix + slug(id), Op: op, Webhook: webhook})
		}
	}
	return ops, nil
}

type refRenderer struct {
	doc *oaDoc
	md  func(string) template.HTML
	b   strings.Builder
}

func esc(s string) string { return html.EscapeString(s) }

func orDefault(s, def string) string {
	if s == "" {
		return def
	}
	return s
}

// refName returns the last element of a local $ref ("#/components/schemas/Error").
func refName(ref, kind string) (string, bool) {
	prefix := "#/components/" + kind + "/"
	if !strings.HasPrefix(ref, prefix) {
		return "", false
	}
	return strings.TrimPrefix(ref, prefix), true
}

func (r *refRenderer) schema(s *oaSchema) *oaSchema {
	for depth := 0; s != nil && s.Ref != "" && depth < 16; depth++ {
		name, ok := refName(s.Ref, "schemas")
		if !ok {
			return s
		}
		t := r.doc.Components.Schemas.Values[name]
		if t == nil {
			return s
		}
		s = t
	}
	return s
}

func (r *refRenderer) response(x *oaResp) *oaResp {
	if x != nil && x.Ref != "" {
		if name, ok := refName(x.Ref, "responses"); ok && r.doc.Components.Responses[name] != nil {
			return r.doc.Components.Responses[name]
		}
	}
	return x
}

func (r *refRenderer) param(x *oaParam) *oaParam {
	if x != nil && x.Ref != "" {
		if name, ok := refName(x.Ref, "parameters"); ok && r.doc.Components.Parameters[name] != nil {
			return r.doc.Components.Parameters[name]
		}
	}
	return x
}

func (r *refRenderer) body(x *oaBody) *oaBody {
	if x != nil && x.Ref != "" {
		if name, ok := refName(x.Ref, "requestBodies"); ok && r.doc.Components.RequestBodies[name] != nil {
			return r.doc.Components.RequestBodies[name]
		}
	}
	return x
}

func (r *refRenderer) header(x *oaHeader) *oaHeader {
	if x != nil && x.Ref != "" {
		if name, ok := refName(x.Ref, "headers"); ok && r.doc.Components.Headers[name] != nil {
			return r.doc.Components.Headers[name]
		}
	}
	return x
}

func (r *refRenderer) operation(o operation) {
	b := &r.b
	op := o.Op
	b.WriteString(`<section class="op" id="` + esc(o.ID) + `">` + "\n")
	b.WriteString(`<h2><span class="method method-` + strings.ToLower(o.Method) + `">` + o.Method + `</span> <code class="path">` + esc(o.Path) + "</code></h2>\n")
	var meta []string
	if op.Summary != "" {
		meta = append(meta, `<strong>`+esc(op.Summary)+`</strong>`)
	}
	if op.OperationID != "" {
		meta = append(meta, `operationId <code>`+esc(op.OperationID)+`</code>`)
	}
	security := r.doc.Security
	if op.Security != nil {
		security = *op.Security
	}
	switch {
	case o.Webhook:
		// Sent by the server: the API key plays no part.
		meta = append(meta, `<span class="tag tag-webhook">sent by the server</span>`)
	case len(security) == 0 || (len(security) == 1 && len(security[0]) == 0):
		meta = append(meta, `<span class="tag tag-public">public</span>`)
	default:
		meta = append(meta, `<span class="tag tag-auth">bearer key</span>`)
	}
	if op.Deprecated {
		meta = append(meta, `<span class="tag">deprecated</span>`)
	}
	b.WriteString(`<p class="op-meta">` + strings.Join(meta, ` · `) + "</p>\n")
	if op.Description != "" {
		b.WriteString(string(r.md(op.Description)))
	}

	if len(op.Parameters) > 0 {
		b.WriteString("<h3>Parameters</h3>\n")
		b.WriteString(`<div class="table-wrap"><table class="fields"><thead><tr><th>Name</th><th>In</th><th>Type</th><th>Description</th></tr></thead><tbody>`)
		for _, p := range op.Parameters {
			p = r.param(p)
			if p == nil {
				continue
			}
			b.WriteString(`<tr><td><code>` + esc(p.Name) + `</code>`)
			if p.Required {
				b.WriteString(` <span class="req">required</span>`)
			}
			b.WriteString(`</td><td>` + esc(p.In) + `</td><td>` + esc(r.typeName(p.Schema)) + `</td><td>` + r.describe(p.Description, p.Schema) + "</td></tr>")
		}
		b.WriteString("</tbody></table></div>\n")
	}

	if body := r.body(op.RequestBody); body != nil {
		b.WriteString("<h3>Request body</h3>\n")
		if body.Description != "" {
			b.WriteString(string(r.md(body.Description)))
		}
		for _, ct := range body.Content.Keys {
			media := body.Content.Values[ct]
			b.WriteString(`<p class="content-type"><code>` + esc(ct) + "</code></p>\n")
			r.fields(media.Schema)
			r.example(media, "Example request")
		}
	}

	if len(op.Responses.Keys) > 0 {
		b.WriteString("<h3>Responses</h3>\n")
		codes := append([]string(nil), op.Responses.Keys...)
		sort.SliceStable(codes, func(i, j int) bool { return codes[i] < codes[j] })
		for _, code := range codes {
			resp := r.response(op.Responses.Values[code])
			if resp == nil {
				continue
			}
			class := "status-other"
			if len(code) == 3 {
				class = "status-" + code[:1] + "xx"
			}
			open := ""
			if strings.HasPrefix(code, "2") {
				open = " open"
			}
			b.WriteString(`<details class="response"` + open + `><summary><span class="status ` + class + `">` + esc(code) + `</span> ` + esc(resp.Description) + "</summary>\n")
			if len(resp.Headers.Keys) > 0 {
				b.WriteString(`<div class="table-wrap"><table class="fields"><thead><tr><th>Header</th><th>Type</th><th>Description</th></tr></thead><tbody>`)
				for _, name := range resp.Headers.Keys {
					h := r.header(resp.Headers.Values[name])
					if h == nil {
						continue
					}
					b.WriteString(`<tr><td><code>` + esc(name) + `</code></td><td>` + esc(r.typeName(h.Schema)) + `</td><td>` + r.describe(h.Description, h.Schema) + "</td></tr>")
				}
				b.WriteString("</tbody></table></div>\n")
			}
			for _, ct := range resp.Content.Keys {
				media := resp.Content.Values[ct]
				if len(resp.Content.Keys) > 1 || ct != "application/json" {
					b.WriteString(`<p class="content-type"><code>` + esc(ct) + "</code></p>\n")
				}
				r.fields(media.Schema)
				r.example(media, "Example")
			}
			b.WriteString("</details>\n")
		}
	}
	b.WriteString("</section>\n")
}

// fieldRow is one line of a flattened schema: nested objects become dotted
// names ("usage.sandbox_seconds"), arrays of objects "items[].name".
type fieldRow struct {
	name     string
	required bool
	s        *oaSchema
}

func (r *refRenderer) flatten(s *oaSchema, prefix string, depth int, rows *[]fieldRow, seen map[*oaSchema]bool) {
	s = r.schema(s)
	if s == nil || depth > 5 || seen[s] {
		return
	}
	seen[s] = true
	defer delete(seen, s)
	props := s.Properties
	required := s.Required
	for _, part := range s.AllOf { // allOf merges the parts' fields
		p := r.schema(part)
		if p == nil {
			continue
		}
		r.flatten(p, prefix, depth, rows, seen)
	}
	req := map[string]bool{}
	for _, n := range required {
		req[n] = true
	}
	for _, name := range props.Keys {
		child := props.Values[name]
		full := prefix + name
		*rows = append(*rows, fieldRow{name: full, required: req[name], s: child})
		cs := r.schema(child)
		if cs == nil {
			continue
		}
		if len(cs.Properties.Keys) > 0 || len(cs.AllOf) > 0 {
			r.flatten(cs, full+".", depth+1, rows, seen)
		} else if it := r.schema(cs.Items); it != nil && len(it.Properties.Keys) > 0 {
			r.flatten(it, full+"[].", depth+1, rows, seen)
		}
	}
}

// fields writes a schema as a table of its fields, or as a one-line type
// when it has none (e.g. a plain string body).
func (r *refRenderer) fields(s *oaSchema) {
	if s == nil {
		return
	}
	var rows []fieldRow
	r.flatten(s, "", 0, &rows, map[*oaSchema]bool{})
	b := &r.b
	if len(rows) == 0 {
		b.WriteString(`<p class="type-line">` + esc(r.typeName(s)) + "</p>\n")
		return
	}
	b.WriteString(`<div class="table-wrap"><table class="fields"><thead><tr><th>Field</th><th>Type</th><th>Description</th></tr></thead><tbody>`)
	for _, f := range rows {
		cs := r.schema(f.s)
		desc := ""
		if f.s != nil {
			desc = f.s.Description
		}
		if desc == "" && cs != nil {
			desc = cs.Description
		}
		b.WriteString(`<tr><td><code>` + esc(f.name) + `</code>`)
		if f.required {
			b.WriteString(` <span class="req">required</span>`)
		}
		b.WriteString(`</td><td>` + esc(r.typeName(f.s)) + `</td><td>` + r.describe(desc, f.s) + "</td></tr>")
	}
	b.WriteString("</tbody></table></div>\n")
}

// typeName describes a schema's type in a few words: "string", "integer
// (int64)", "array of string", "Error", "string or null".
func (r *refRenderer) typeName(s *oaSchema) string {
	if s == nil {
		return ""
	}
	if s.Ref != "" {
		if name, ok := refName(s.Ref, "schemas"); ok {
			if t := r.schema(s); t != nil && len(t.Properties.Keys) == 0 && len(t.AllOf) == 0 {
				return r.typeName(t)
			}
			return name
		}
	}
	var types []string
	if len(s.Type) > 0 {
		var one string
		if json.Unmarshal(s.Type, &one) == nil {
			types = []string{one}
		} else {
			_ = json.Unmarshal(s.Type, &types)
		}
	}
	var alts []string
	for _, alt := range append(append([]*oaSchema{}, s.OneOf...), s.AnyOf...) {
		alts = append(alts, r.typeName(alt))
	}
	if len(types) == 0 && len(alts) > 0 {
		return strings.Join(alts, " or ")
	}
	for i, t := range types {
		switch t {
		case "array":
			if s.Items != nil {
				types[i] = "array of " + r.typeName(s.Items)
			}
		case "object":
			if len(s.Properties.Keys) == 0 && len(s.AdditionalProperties) > 0 && string(s.AdditionalProperties) != "false" && string(s.AdditionalProperties) != "true" {
				var ap oaSchema
				if json.Unmarshal(s.AdditionalProperties, &ap) == nil {
					types[i] = "map of " + r.typeName(&ap)
				}
			}
		default:
			if s.Format != "" && i == 0 {
				types[i] = t + " (" + s.Format + ")"
			}
		}
	}
	if len(types) == 0 {
		if len(s.Properties.Keys) > 0 {
			return "object"
		}
		return "any"
	}
	return strings.Join(types, " or ")
}

// describe renders a field's description followed by its constraints.
func (r *refRenderer) describe(desc string, s *oaSchema) string {
	var b strings.Builder
	if desc != "" {
		b.WriteString(inlineMarkdown(desc))
	}
	s = r.schema(s)
	if s == nil {
		return b.String()
	}
	var notes []string
	if len(s.Enum) > 0 {
		var vals []string
		for _, v := range s.Enum {
			vals = append(vals, "<code>"+esc(jsonText(v))+"</code>")
		}
		notes = append(notes, "One of "+strings.Join(vals, ", "))
	}
	if len(s.Const) > 0 {
		notes = append(notes, "Always <code>"+esc(jsonText(s.Const))+"</code>")
	}
	if s.Minimum != nil && s.Maximum != nil {
		notes = append(notes, "From "+num(*s.Minimum)+" to "+num(*s.Maximum))
	} else if s.Minimum != nil {
		notes = append(notes, "At least "+num(*s.Minimum))
	} else if s.Maximum != nil {
		notes = append(notes, "At most "+num(*s.Maximum))
	}
	if s.MinLength != nil || s.MaxLength != nil {
		chars := func(n int) string {
			if n == 1 {
				return "1 character"
			}
			return strconv.Itoa(n) + " characters"
		}
		switch {
		case s.MinLength != nil && s.MaxLength != nil:
			notes = append(notes, strconv.Itoa(*s.MinLength)+"–"+chars(*s.MaxLength))
		case s.MaxLength != nil:
			notes = append(notes, "At most "+chars(*s.MaxLength))
		default:
			notes = append(notes, "At least "+chars(*s.MinLength))
		}
	}
	if s.Pattern != "" {
		notes = append(notes, "Pattern <code>"+esc(s.Pattern)+"</code>")
	}
	if len(s.Default) > 0 {
		notes = append(notes, "Default <code>"+esc(jsonText(s.Default))+"</code>")
	}
	if len(notes) > 0 {
		b.WriteString(`<span class="constraints">` + strings.Join(notes, ". ") + ".</span>")
	}
	return b.String()
}

func num(f float64) string { return strconv.FormatFloat(f, 'f', -1, 64) }

func jsonText(raw json.RawMessage) string {
	var v any
	if json.Unmarshal(raw, &v) != nil {
		return string(raw)
	}
	if s, ok := v.(string); ok {
		return strconv.Quote(s)
	}
	out, _ := json.Marshal(v)
	return string(out)
}

// example writes the media's example, or one made up from the schema.
func (r *refRenderer) example(media oaMedia, label string) {
	raw := media.Example
	if len(raw) == 0 && len(media.Examples.Keys) > 0 {
		raw = media.Examples.Values[media.Examples.Keys[0]].Value
	}
	if len(raw) == 0 {
		v := r.sample(media.Schema, 0)
		if v == nil {
			return
		}
		var err error
		if raw, err = json.Marshal(v); err != nil {
			return
		}
	}
	// Indent the document's own bytes, so its key order survives.
	var out bytes.Buffer
	if json.Indent(&out, raw, "", "  ") != nil {
		return
	}
	r.b.WriteString(`<p class="example-label">` + esc(label) + "</p>\n")
	r.b.WriteString(`<pre><code class="language-json">` + esc(out.String()) + "</code></pre>\n")
}

// sample builds an example value from a schema: its example, default or
// first enum value, else a placeholder of the right type.
func (r *refRenderer) sample(s *oaSchema, depth int) any {
	s = r.schema(s)
	if s == nil || depth > 6 {
		return nil
	}
	for _, raw := range []json.RawMessage{s.Example, s.Const, s.Default} {
		if len(raw) > 0 {
			var v any
			if json.Unmarshal(raw, &v) == nil {
				return v
			}
		}
	}
	if len(s.Examples) > 0 {
		var v any
		if json.Unmarshal(s.Examples[0], &v) == nil {
			return v
		}
	}
	if len(s.Enum) > 0 {
		var v any
		if json.Unmarshal(s.Enum[0], &v) == nil {
			return v
		}
	}
	if len(s.Properties.Keys) > 0 || len(s.AllOf) > 0 {
		obj := map[string]any{}
		for _, part := range s.AllOf {
			if m, ok := r.sample(part, depth+1).(map[string]any); ok {
				for k, v := range m {
					obj[k] = v
				}
			}
		}
		for _, k := range s.Properties.Keys {
			if v := r.sample(s.Properties.Values[k], depth+1); v != nil {
				obj[k] = v
			}
		}
		return orderedObject{keys: append(mapKeysFromAllOf(r, s), s.Properties.Keys...), m: obj}
	}
	if len(s.OneOf) > 0 {
		return r.sample(s.OneOf[0], depth+1)
	}
	if len(s.AnyOf) > 0 {
		return r.sample(s.AnyOf[0], depth+1)
	}
	var t string
	if json.Unmarshal(s.Type, &t) != nil {
		var ts []string
		if json.Unmarshal(s.Type, &ts) == nil && len(ts) > 0 {
			t = ts[0]
		}
	}
	switch t {
	case "string":
		return sampleString(s)
	case "integer":
		if s.Minimum != nil {
			return int64(*s.Minimum)
		}
		return 0
	case "number":
		if s.Minimum != nil {
			return *s.Minimum
		}
		return 0.0
	case "boolean":
		return false
	case "array":
		if v := r.sample(s.Items, depth+1); v != nil {
			return []any{v}
		}
		return []any{}
	}
	return nil
}

var reHexRun = regexp.MustCompile(`\[(?:0-9a-f|a-f0-9)\]\{(\d+)\}`)

// sampleString makes a plausible value for a string schema: an id pattern
// such as ^exe_[0-9a-f]{32}$ becomes "exe_" and 32 hex digits.
func sampleString(s *oaSchema) string {
	if p := strings.TrimPrefix(s.Pattern, "^"); p != s.Pattern {
		lit := p
		if i := strings.IndexAny(p, `[(\.*+?{|$`); i >= 0 {
			lit = p[:i]
		}
		if m := reHexRun.FindStringSubmatch(p); m != nil && lit != "" {
			n, _ := strconv.Atoi(m[1])
			return lit + strings.Repeat("0123456789abcdef", n/16+1)[:n]
		}
	}
	switch s.Format {
	case "date-time":
		return "2025-01-01T00:00:00Z"
	case "uri":
		return "https://example.com"
	}
	return "string"
}

func mapKeysFromAllOf(r *refRenderer, s *oaSchema) []string {
	var keys []string
	for _, part := range s.AllOf {
		if p := r.schema(part); p != nil {
			keys = append(keys, p.Properties.Keys...)
		}
	}
	return keys
}

// orderedObject marshals its keys in schema order, so a made-up example
// reads like the real response.
type orderedObject struct {
	keys []string
	m    map[string]any
}

func (o orderedObject) MarshalJSON() ([]byte, error) {
	var b bytes.Buffer
	b.WriteByte('{')
	done := map[string]bool{}
	for _, k := range o.keys {
		v, ok := o.m[k]
		if !ok || done[k] {
			continue
		}
		done[k] = true
		if b.Len() > 1 {
			b.WriteByte(',')
		}
		kb, _ := json.Marshal(k)
		vb, err := json.Marshal(v)
		if err != nil {
			return nil, err
		}
		b.Write(kb)
		b.WriteByte(':')
		b.Write(vb)
	}
	b.WriteByte('}')
	return b.Bytes(), nil
}
