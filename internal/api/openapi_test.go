package api

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/santhosh-tekuri/jsonschema/v6"
)

// This file checks the server against its OpenAPI document: every
// response of every test passes through conformance, and
// TestOpenAPICoverage makes the server produce every documented response.
// Schemas are checked by a complete JSON Schema 2020-12 validator (the
// dialect of OpenAPI 3.1), with formats asserted, so a keyword the
// document uses is never silently ignored.

// docURL names the document for the schema compiler; schemas are
// compiled by JSON pointer into it, so $refs resolve as in the document.
const docURL = "https://vertal.invalid/openapi.json"

type openAPIDoc struct {
	raw      map[string]any
	paths    []docPath
	compiler *jsonschema.Compiler

	mu      sync.Mutex
	schemas map[string]*jsonschema.Schema // by pointer
}

type docPath struct {
	template string
	re       *regexp.Regexp
	methods  map[string]map[string]any // method → operation
}

var (
	docOnce sync.Once
	docVal  *openAPIDoc
	docErr  error
)

func loadDoc(t testing.TB) *openAPIDoc {
	t.Helper()
	docOnce.Do(func() {
		var raw map[string]any
		if docErr = json.Unmarshal(openAPISpec, &raw); docErr != nil {
			return
		}
		c := jsonschema.NewCompiler()
		c.DefaultDraft(jsonschema.Draft2020)
		c.AssertFormat()
		c.AssertContent()
		inst, err := jsonschema.UnmarshalJSON(bytes.NewReader(openAPISpec))
		if err != nil {
			docErr = err
			return
		}
		if docErr = c.AddResource(docURL, inst); docErr != nil {
			return
		}
		d := &openAPIDoc{raw: raw, compiler: c, schemas: map[string]*jsonschema.Schema{}}
		for tmpl, item := range raw["paths"].(map[string]any) {
			re := regexp.MustCompile("^" + regexp.MustCompile(`\\\{[a-z_]+\\\}`).ReplaceAllString(regexp.QuoteMeta(tmpl), `[^/]+`) + "$")
			p := docPath{template: tmpl, re: re, methods: map[string]map[string]any{}}
			for m, op := range item.(map[string]any) {
				p.methods[strings.ToUpper(m)] = op.(map[string]any)
			}
			d.paths = append(d.paths, p)
		}
		docVal = d
	})
	if docErr != nil {
		t.Fatalf("openapi.json: %v", docErr)
	}
	return docVal
}

// resolve follows a local $ref.
func (d *openAPIDoc) resolve(v map[string]any) map[string]any {
	for {
		ref, ok := v["$ref"].(string)
		if !ok {
			return v
		}
		_, v = d.at(ref)
	}
}

// at returns the object at a JSON pointer ("#/a/b") of the document,
// following the $ref of an OpenAPI object (a response, a header), with
// the pointer it ends at.
func (d *openAPIDoc) at(ptr string) (string, map[string]any) {
	for {
		v := d.lookup(ptr)
		ref, ok := v["$ref"].(string)
		if !ok {
			return ptr, v
		}
		ptr = ref
	}
}

// lookup returns the object at a JSON pointer, or nil.
func (d *openAPIDoc) lookup(ptr string) map[string]any {
	var cur any = d.raw
	for _, part := range strings.Split(strings.TrimPrefix(ptr, "#/"), "/") {
		part = strings.NewReplacer("~1", "/", "~0", "~").Replace(part)
		switch c := cur.(type) {
		case map[string]any:
			cur = c[part]
		case []any: // oneOf/0
			i, err := strconv.Atoi(part)
			if err != nil || i < 0 || i >= len(c) {
				return nil
			}
			cur = c[i]
		default:
			return nil
		}
	}
	v, _ := cur.(map[string]any)
	return v
}

// pointer joins escaped JSON pointer tokens.
func pointer(base string, tokens ...string) string {
	for _, t := range tokens {
		base += "/" + strings.NewReplacer("~", "~0", "/", "~1").Replace(t)
	}
	return base
}

// schema compiles the schema at ptr once.
func (d *openAPIDoc) schema(ptr string) (*jsonschema.Schema, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if s, ok := d.schemas[ptr]; ok {
		return s, nil
	}
	s, err := d.compiler.Compile(docURL + ptr)
	if err != nil {
		return nil, err
	}
	d.schemas[ptr] = s
	return s, nil
}

// validate checks v against the schema at ptr and returns every violation.
func (d *openAPIDoc) validate(ptr string, v any, at string) []string {
	s, err := d.schema(ptr)
	if err != nil {
		return []string{fmt.Sprintf("%s: compiling schema %s: %v", at, ptr, err)}
	}
	if err := s.Validate(v); err != nil {
		return []string{fmt.Sprintf("%s: %v", at, err)}
	}
	return nil
}

// operation finds the documented operation for a request; path is taken
// without the /api mount prefix.
func (d *openAPIDoc) operation(method, path string) (tmpl string, op map[string]any) {
	path = strings.TrimPrefix(path, "/api")
	if method == http.MethodHead {
		method = http.MethodGet
	}
	// A path without templating wins over a templated one that also
	// matches (/v1/executions/batch, not /v1/executions/{id}), as OpenAPI
	// says; d.paths is in no particular order.
	for _, p := range d.paths {
		if p.template == path {
			return p.template, p.methods[method]
		}
	}
	for _, p := range d.paths {
		if p.re.MatchString(path) {
			return p.template, p.methods[method]
		}
	}
	return "", nil
}

// checkResponse validates one response; it returns the problems found
// and the documented key "METHOD template status" it matched.
func (d *openAPIDoc) checkResponse(method, path string, status int, h http.Header, body []byte) (string, []string) {
	var errs []string
	tmpl, op := d.operation(method, path)
	if op == nil {
		// Not an API operation: web pages, MCP and its OAuth discovery
		// documents (oauth.go) answer as they like when they succeed;
		// every failure is in the error shape.
		if status < 400 {
			if isAPIPath(path) && !strings.HasSuffix(path, "/mcp") && !strings.HasPrefix(path, "/api/.well-known/") {
				errs = append(errs, fmt.Sprintf("undocumented API route answered %d", status))
			}
			return "", errs
		}
		if status == http.StatusMethodNotAllowed && h.Get("Allow") == "" {
			errs = append(errs, "405 without Allow")
		}
		return "", append(errs, d.checkBody("#/components/schemas/Error", h, body)...)
	}
	key := fmt.Sprintf("%s %s %d", strings.ToUpper(methodOf(method)), tmpl, status)
	resps := op["responses"].(map[string]any)
	code := strconv.Itoa(status)
	if _, ok := resps[code]; !ok {
		code = "default"
	}
	if _, ok := resps[code]; !ok {
		return key, []string{fmt.Sprintf("%s: status not documented", key)}
	}
	ptr, resp := d.at(pointer("#/paths", tmpl, strings.ToLower(methodOf(method)), "responses", code))
	if hs, ok := resp["headers"].(map[string]any); ok {
		for name := range hs {
			hptr, hdef := d.at(pointer(ptr, "headers", name))
			val := h.Get(name)
			if val == "" {
				if req, _ := hdef["required"].(bool); req {
					errs = append(errs, fmt.Sprintf("%s: missing header %s", key, name))
				}
				continue
			}
			// A header is text; one whose schema is numeric is judged as
			// the number it spells.
			var v any = val
			if s, _ := hdef["schema"].(map[string]any); s["type"] == "integer" || s["type"] == "number" {
				n, err := jsonschema.UnmarshalJSON(strings.NewReader(val))
				if _, isNum := n.(json.Number); err != nil || !isNum {
					errs = append(errs, fmt.Sprintf("%s: header %s=%q is not a number", key, name, val))
					continue
				}
				v = n
			}
			for _, e := range d.validate(pointer(hptr, "schema"), v, "header "+name) {
				errs = append(errs, key+": "+e)
			}
		}
	}
	if content, ok := resp["content"].(map[string]any); ok && method != http.MethodHead {
		check := d.checkBody(pointer(ptr, "content", "application/json", "schema"), h, body)
		if h.Get("Content-Type") == "text/event-stream" {
			// A stream-only answer lists the stream as its content; the
			// run's 200, whose content is the JSON execution, names the
			// stream an Accept header asks for in x-event-stream.
			if _, sse := content["text/event-stream"]; sse {
				check = d.checkEvents(pointer(ptr, "content", "text/event-stream", "schema"), body)
			} else if _, sse := resp["x-event-stream"]; sse {
				check = d.checkEvents(pointer(ptr, "x-event-stream", "schema"), body)
			}
		}
		for _, e := range check {
			errs = append(errs, key+": "+e)
		}
	}
	return key, errs
}

func methodOf(m string) string {
	if m == http.MethodHead {
		return http.MethodGet
	}
	return m
}

func (d *openAPIDoc) checkBody(ptr string, h http.Header, body []byte) []string {
	if ct := h.Get("Content-Type"); ct != "application/json" {
		return []string{fmt.Sprintf("content type %q", ct)}
	}
	v, err := jsonschema.UnmarshalJSON(bytes.NewReader(body))
	if err != nil {
		return []string{fmt.Sprintf("body is not JSON: %v", err)}
	}
	return d.validate(ptr, v, "body")
}

// checkEvents validates a server-sent event stream: each event, as
// {"id", "event", "data"}, against the schema at ptr; comments are only
// the heartbeat.
func (d *openAPIDoc) checkEvents(ptr string, body []byte) []string {
	var errs []string
	for i, block := range strings.Split(strings.TrimSuffix(string(body), "\n\n"), "\n\n") {
		if block == "" {
			continue
		}
		if block == ": heartbeat" {
			continue
		}
		ev := map[string]any{}
		for _, line := range strings.Split(block, "\n") {
			field, value, _ := strings.Cut(line, ": ")
			switch field {
			case "id", "event":
				ev[field] = value
			case "data":
				v, err := jsonschema.UnmarshalJSON(strings.NewReader(value))
				if err != nil {
					errs = append(errs, fmt.Sprintf("event %d: data is not JSON: %v", i, err))
				}
				ev["data"] = v
			default:
				errs = append(errs, fmt.Sprintf("event %d: unexpected line %q", i, line))
			}
		}
		errs = append(errs, d.validate(ptr, ev, fmt.Sprintf("event %d", i))...)
	}
	return errs
}

// conformance checks every response h gives against the document and
// stores the documented response it matched in covered.
func conformance(t testing.TB, h http.Handler, covered *sync.Map) http.Handler {
	d := loadDoc(t)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		tw := &teeWriter{ResponseWriter: w}
		h.ServeHTTP(tw, r)
		status := tw.status
		if status == 0 {
			status = http.StatusOK
		}
		// The server routes a cleaned API path; judge the answer by it.
		p := cleanAPIPath(r.Clone(r.Context())).URL.Path
		if isE2BPath(p) {
			// E2B's API is not in our document: judge it by what E2B's SDK accepts.
			for _, e := range e2bWireProblems(p, status, w.Header(), tw.buf.Bytes()) {
				t.Errorf("E2B wire: %s %s → %d: %s\nbody: %s", r.Method, r.URL.Path, status, e, clip(tw.buf.String(), 400))
			}
			return
		}
		if tw.web {
			return
		}
		key, errs := d.checkResponse(r.Method, p, status, w.Header(), tw.buf.Bytes())
		if key != "" {
			covered.Store(key, true)
		}
		for _, e := range errs {
			t.Errorf("OpenAPI conformance: %s %s → %d: %s\nbody: %s", r.Method, r.URL.Path, status, e, clip(tw.buf.String(), 400))
		}
	})
}

type teeWriter struct {
	http.ResponseWriter
	status int
	buf    bytes.Buffer
	web    bool
}

func (w *teeWriter) WriteHeader(code int) {
	if w.status == 0 {
		w.status = code
		ct := w.Header().Get("Content-Type")
		w.web = !strings.HasPrefix(ct, "application/json") && ct != "text/event-stream" && code < 400
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *teeWriter) Write(b []byte) (int, error) {
	if w.status == 0 {
		w.WriteHeader(http.StatusOK)
	}
	w.buf.Write(b)
	return w.ResponseWriter.Write(b)
}

func (w *teeWriter) Flush() { http.NewResponseController(w.ResponseWriter).Flush() }

func TestOpenAPIDocumentForWeb(t *testing.T) {
	doc, err := OpenAPIDocument("1.2.3", "/api")
	if err != nil {
		t.Fatal(err)
	}
	var d struct {
		Servers []struct{ URL string }   `json:"servers"`
		Info    struct{ Version string } `json:"info"`
	}
	if err := json.Unmarshal(doc, &d); err != nil || d.Servers[0].URL != "/api" || d.Info.Version != "1.2.3" {
		t.Errorf("%v %+v", err, d)
	}
	if _, err := OpenAPIDocument("1", "/nope"); err == nil {
		t.Errorf("unknown mount accepted")
	}
}

// schemaKeywords are the keywords of JSON Schema 2020-12 (core, applicator,
// unevaluated, validation, meta-data, format, content) and the ones
// OpenAPI 3.1 adds. A validator ignores any other key, so a typo such as
// "minimun" would check nothing; TestOpenAPISchemas refuses it.
var schemaKeywords = map[string]bool{
	"$schema": true, "$id": true, "$ref": true, "$anchor": true, "$dynamicRef": true, "$dynamicAnchor": true,
	"$vocabulary": true, "$comment": true, "$defs": true,
	"allOf": true, "anyOf": true, "oneOf": true, "not": true, "if": true, "then": true, "else": true,
	"dependentSchemas": true, "prefixItems": true, "items": true, "contains": true, "properties": true,
	"patternProperties": true, "additionalProperties": true, "propertyNames": true,
	"unevaluatedItems": true, "unevaluatedProperties": true,
	"type": true, "enum": true, "const": true, "multipleOf": true, "maximum": true, "exclusiveMaximum": true,
	"minimum": true, "exclusiveMinimum": true, "maxLength": true, "minLength": true, "pattern": true,
	"maxItems": true, "minItems": true, "uniqueItems": true, "maxContains": true, "minContains": true,
	"maxProperties": true, "minProperties": true, "required": true, "dependentRequired": true,
	"title": true, "description": true, "default": true, "deprecated": true, "readOnly": true, "writeOnly": true,
	"examples": true, "format": true, "contentEncoding": true, "contentMediaType": true, "contentSchema": true,
	"discriminator": true, "xml": true, "externalDocs": true, "example": true,
}

// subschemas lists the pointers of the schemas directly inside schema s at ptr.
func subschemas(ptr string, s map[string]any) []string {
	var out []string
	for k, v := range s {
		switch k {
		case "properties", "patternProperties", "$defs", "dependentSchemas":
			for name := range v.(map[string]any) {
				out = append(out, pointer(ptr, k, name))
			}
		case "allOf", "anyOf", "oneOf", "prefixItems":
			for i := range v.([]any) {
				out = append(out, pointer(ptr, k, strconv.Itoa(i)))
			}
		case "items", "additionalProperties", "not", "if", "then", "else", "contains", "propertyNames",
			"unevaluatedItems", "unevaluatedProperties", "contentSchema":
			if _, ok := v.(map[string]any); ok {
				out = append(out, pointer(ptr, k))
			}
		}
	}
	return out
}

// TestOpenAPISchemas compiles every schema of the document (which checks
// it against the 2020-12 meta-schema), refuses keys no validator would
// act on, and checks each schema's examples against the schema.
func TestOpenAPISchemas(t *testing.T) {
	d := loadDoc(t)
	var roots []string
	for name := range d.raw["components"].(map[string]any)["schemas"].(map[string]any) {
		roots = append(roots, pointer("#/components/schemas", name))
	}
	for _, p := range d.paths {
		for m, op := range p.methods {
			opPtr := pointer("#/paths", p.template, strings.ToLower(m))
			if rb, ok := op["requestBody"].(map[string]any); ok {
				for mt := range rb["content"].(map[string]any) {
					roots = append(roots, pointer(opPtr, "requestBody", "content", mt, "schema"))
				}
			}
			for status := range op["responses"].(map[string]any) {
				rptr, resp := d.at(pointer(opPtr, "responses", status))
				for name := range resp["headers"].(map[string]any) {
					hptr, _ := d.at(pointer(rptr, "headers", name))
					roots = append(roots, pointer(hptr, "schema"))
				}
				for mt := range resp["content"].(map[string]any) {
					roots = append(roots, pointer(rptr, "content", mt, "schema"))
				}
			}
		}
	}
	// The webhooks section (OpenAPI 3.1): what the server sends.
	for name, item := range d.raw["webhooks"].(map[string]any) {
		for m, op := range item.(map[string]any) {
			opPtr := pointer("#/webhooks", name, m)
			for i := range op.(map[string]any)["parameters"].([]any) {
				roots = append(roots, pointer(opPtr, "parameters", strconv.Itoa(i), "schema"))
			}
			for mt := range op.(map[string]any)["requestBody"].(map[string]any)["content"].(map[string]any) {
				roots = append(roots, pointer(opPtr, "requestBody", "content", mt, "schema"))
			}
		}
	}
	seen := map[string]bool{}
	for len(roots) > 0 {
		ptr := roots[0]
		roots = roots[1:]
		if seen[ptr] {
			continue
		}
		seen[ptr] = true
		s := d.lookup(ptr)
		if s == nil {
			t.Errorf("%s: no schema there", ptr)
			continue
		}
		sch, err := d.schema(ptr)
		if err != nil {
			t.Errorf("%s: %v", ptr, err)
			continue
		}
		for k := range s {
			if !schemaKeywords[k] {
				t.Errorf("%s: %q is not a JSON Schema keyword; a validator would ignore it", ptr, k)
			}
		}
		if ex, ok := s["examples"].([]any); ok {
			for i := range ex {
				v, _ := jsonschema.UnmarshalJSON(bytes.NewReader(mustJSON(t, ex[i])))
				if err := sch.Validate(v); err != nil {
					t.Errorf("%s: example %d does not match its schema: %v", ptr, i, err)
				}
			}
		}
		roots = append(roots, subschemas(ptr, s)...)
		if ref, ok := s["$ref"].(string); ok {
			roots = append(roots, ref)
		}
	}
	if len(seen) < 20 {
		t.Errorf("only %d schemas found; the walk is broken", len(seen))
	}
}

func mustJSON(t *testing.T, v any) []byte {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// TestOpenAPIValidatorRefuses feeds answers that break the document in
// ways the server must never answer, and expects the conformance check
// to name each one.
func TestOpenAPIValidatorRefuses(t *testing.T) {
	d := loadDoc(t)
	good := `{"id":"exe_0123456789abcdef0123456789abcdef","status":"succeeded","stdout":"42\n","stderr":"","exit_code":0,"duration_ms":5,` +
		`"truncated":false,"usage":{"sandbox_seconds":0.005,"cpu_seconds":0.001,"peak_memory_bytes":1024},"language":"python","image":"default","image_version":null,"created_at":1,"started_at":1,"finished_at":null,"files":[],"files_truncated":false,"webhook":null,"reason":null,"request_id":"req_0123456789abcdef0123456789abcdef"}`
	for _, tc := range []struct {
		name, body, want string
		header           func(http.Header)
	}{
		{"valid", good, "", nil},
		{"unknown property", strings.Replace(good, `"stderr":""`, `"stderr":"","extra":1`, 1), "additional properties 'extra'", nil},
		{"bad enum", strings.Replace(good, `"succeeded"`, `"done"`, 1), "status", nil},
		{"not an integer", strings.Replace(good, `"exit_code":0`, `"exit_code":0.5`, 1), "exit_code", nil},
		{"below minimum", strings.Replace(good, `"duration_ms":5`, `"duration_ms":-1`, 1), "duration_ms", nil},
		{"pattern", strings.Replace(good, `"id":"exe_`, `"id":"run_`, 1), "id", nil},
		{"const", strings.Replace(good, `"truncated":false`, `"truncated":false,"idempotent_replay":false`, 1), "idempotent_replay", nil},
		{"missing required", strings.Replace(good, `"stdout":"42\n",`, ``, 1), "stdout", nil},
		{"type union", strings.Replace(good, `"finished_at":null`, `"finished_at":"soon"`, 1), "finished_at", nil},
		{"nested ref", strings.Replace(good, `"sandbox_seconds":0.005`, `"sandbox_seconds":"0.005"`, 1), "sandbox_seconds", nil},
		{"header missing", good, "missing header X-RateLimit-Limit", func(h http.Header) { h.Del("X-RateLimit-Limit") }},
		{"header not a number", good, "header X-RateLimit-Remaining=\"many\" is not a number", func(h http.Header) { h.Set("X-RateLimit-Remaining", "many") }},
		{"header below minimum", good, "header X-RateLimit-Remaining", func(h http.Header) { h.Set("X-RateLimit-Remaining", "-1") }},
		{"wrong content type", good, "content type", func(h http.Header) { h.Set("Content-Type", "text/plain") }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := http.Header{"Content-Type": {"application/json"}, "X-Request-Id": {"req_0123456789abcdef0123456789abcdef"},
				"X-Ratelimit-Limit": {"120"}, "X-Ratelimit-Remaining": {"119"}, "X-Ratelimit-Reset": {"1700000000"}}
			if tc.header != nil {
				tc.header(h)
			}
			_, errs := d.checkResponse("GET", "/v1/executions/exe_0123456789abcdef0123456789abcdef", 200, h, []byte(tc.body))
			got := strings.Join(errs, "\n")
			switch {
			case tc.want == "" && got != "":
				t.Errorf("valid answer refused: %s", got)
			case tc.want != "" && !strings.Contains(got, tc.want):
				t.Errorf("errors %q, want one naming %q", got, tc.want)
			}
		})
	}
}

// TestOpenAPIForGeneratedClients: what client generators need of the
// document (tests/openapi runs the generators themselves). An optional
// property of a request schema has no default, since openapi-typescript
// (defaultNonNullable) makes such a property required; and no answer lists
// more than one media type, so that a generated client types its data as
// one schema (the run's stream is named in x-event-stream instead).
func TestOpenAPIForGeneratedClients(t *testing.T) {
	d := loadDoc(t)
	schemas := d.raw["components"].(map[string]any)["schemas"].(map[string]any)
	for _, name := range []string{"ExecutionRequest", "InputFile", "BatchRequest"} {
		s, ok := schemas[name].(map[string]any)
		if !ok {
			t.Errorf("no schema %s", name)
			continue
		}
		required, _ := s["required"].([]any)
		for prop, v := range s["properties"].(map[string]any) {
			if _, ok := v.(map[string]any)["default"]; ok && !slices.Contains(required, any(prop)) {
				t.Errorf("%s.%s is optional and has a default: generated types make it required", name, prop)
			}
		}
	}
	for _, p := range d.paths {
		for m, op := range p.methods {
			for status := range op["responses"].(map[string]any) {
				_, resp := d.at(pointer("#/paths", p.template, strings.ToLower(m), "responses", status))
				if content, _ := resp["content"].(map[string]any); len(content) > 1 {
					t.Errorf("%s %s %s lists %d media types; generated clients type its data as their union", m, p.template, status, len(content))
				}
			}
		}
	}
}
