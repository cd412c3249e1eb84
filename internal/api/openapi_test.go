package api

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
)

// This file checks the server against its OpenAPI document: every
// response of every test passes through conformance, and
// TestOpenAPICoverage makes the server produce every documented response.
// The validator implements the part of JSON Schema (2020-12) the document
// uses: $ref, type, properties, required, additionalProperties, items,
// enum, const, pattern, minimum, minLength.

type openAPIDoc struct {
	raw   map[string]any
	paths []docPath
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
		d := &openAPIDoc{raw: raw}
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
		var cur any = d.raw
		for _, part := range strings.Split(strings.TrimPrefix(ref, "#/"), "/") {
			cur = cur.(map[string]any)[part]
		}
		v = cur.(map[string]any)
	}
}

// operation finds the documented operation for a request; path is taken
// without the /api mount prefix.
func (d *openAPIDoc) operation(method, path string) (tmpl string, op map[string]any) {
	path = strings.TrimPrefix(path, "/api")
	if method == http.MethodHead {
		method = http.MethodGet
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
		// Not an API operation: web pages and MCP answer as they like when
		// they succeed; every failure is in the error shape.
		if status < 400 {
			if isAPIPath(path) && !strings.HasSuffix(path, "/mcp") {
				errs = append(errs, fmt.Sprintf("undocumented API route answered %d", status))
			}
			return "", errs
		}
		if status == http.StatusMethodNotAllowed && h.Get("Allow") == "" {
			errs = append(errs, "405 without Allow")
		}
		return "", append(errs, d.checkBody(map[string]any{"$ref": "#/components/schemas/Error"}, h, body)...)
	}
	key := fmt.Sprintf("%s %s %d", strings.ToUpper(methodOf(method)), tmpl, status)
	resps := op["responses"].(map[string]any)
	r, ok := resps[strconv.Itoa(status)]
	if !ok {
		r, ok = resps["default"]
	}
	if !ok {
		return key, []string{fmt.Sprintf("%s: status not documented", key)}
	}
	resp := d.resolve(r.(map[string]any))
	if hs, ok := resp["headers"].(map[string]any); ok {
		for name, hv := range hs {
			hdef := d.resolve(hv.(map[string]any))
			val := h.Get(name)
			if val == "" {
				if req, _ := hdef["required"].(bool); req {
					errs = append(errs, fmt.Sprintf("%s: missing header %s", key, name))
				}
				continue
			}
			var v any = val
			if s := hdef["schema"].(map[string]any); s["type"] == "integer" {
				if _, err := strconv.ParseInt(val, 10, 64); err != nil {
					errs = append(errs, fmt.Sprintf("%s: header %s=%q is not an integer", key, name, val))
					continue
				}
				v = json.Number(val)
			}
			for _, e := range d.validate(hdef["schema"].(map[string]any), v, "header "+name) {
				errs = append(errs, key+": "+e)
			}
		}
	}
	if content, ok := resp["content"].(map[string]any); ok && method != http.MethodHead {
		mt := content["application/json"].(map[string]any)
		for _, e := range d.checkBody(mt["schema"].(map[string]any), h, body) {
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

func (d *openAPIDoc) checkBody(schema map[string]any, h http.Header, body []byte) []string {
	if ct := h.Get("Content-Type"); ct != "application/json" {
		return []string{fmt.Sprintf("content type %q", ct)}
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		return []string{fmt.Sprintf("body is not JSON: %v", err)}
	}
	return d.validate(schema, v, "body")
}

// validate checks v against schema and returns every violation.
func (d *openAPIDoc) validate(schema map[string]any, v any, at string) []string {
	schema = d.resolve(schema)
	var errs []string
	bad := func(format string, args ...any) { errs = append(errs, at+": "+fmt.Sprintf(format, args...)) }
	if t, ok := schema["type"]; ok {
		var types []string
		switch t := t.(type) {
		case string:
			types = []string{t}
		case []any:
			for _, x := range t {
				types = append(types, x.(string))
			}
		}
		match := false
		for _, typ := range types {
			if jsonType(v, typ) {
				match = true
			}
		}
		if !match {
			bad("%v is not of type %v", v, types)
			return errs
		}
	}
	if c, ok := schema["const"]; ok && fmt.Sprint(c) != fmt.Sprint(v) {
		bad("%v is not the constant %v", v, c)
	}
	if enum, ok := schema["enum"].([]any); ok {
		found := false
		for _, e := range enum {
			if fmt.Sprint(e) == fmt.Sprint(v) {
				found = true
			}
		}
		if !found {
			bad("%v is not one of %v", v, enum)
		}
	}
	switch v := v.(type) {
	case string:
		if p, ok := schema["pattern"].(string); ok && !regexp.MustCompile(p).MatchString(v) {
			bad("%q does not match %s", v, p)
		}
		if n, ok := schema["minLength"].(float64); ok && float64(len([]rune(v))) < n {
			bad("shorter than %v", n)
		}
	case json.Number:
		f, _ := v.Float64()
		if m, ok := schema["minimum"].(float64); ok && f < m {
			bad("%v is below the minimum %v", v, m)
		}
	case map[string]any:
		props, _ := schema["properties"].(map[string]any)
		if req, ok := schema["required"].([]any); ok {
			for _, r := range req {
				if _, ok := v[r.(string)]; !ok {
					bad("missing required property %s", r)
				}
			}
		}
		names := make([]string, 0, len(v))
		for k := range v {
			names = append(names, k)
		}
		sort.Strings(names)
		for _, k := range names {
			if ps, ok := props[k]; ok {
				errs = append(errs, d.validate(ps.(map[string]any), v[k], at+"."+k)...)
				continue
			}
			switch ap := schema["additionalProperties"].(type) {
			case bool:
				if !ap {
					bad("unexpected property %s", k)
				}
			case map[string]any:
				errs = append(errs, d.validate(ap, v[k], at+"."+k)...)
			}
		}
	case []any:
		if items, ok := schema["items"].(map[string]any); ok {
			for i, x := range v {
				errs = append(errs, d.validate(items, x, fmt.Sprintf("%s[%d]", at, i))...)
			}
		}
	}
	return errs
}

func jsonType(v any, typ string) bool {
	switch typ {
	case "object":
		_, ok := v.(map[string]any)
		return ok
	case "array":
		_, ok := v.([]any)
		return ok
	case "string":
		_, ok := v.(string)
		return ok
	case "boolean":
		_, ok := v.(bool)
		return ok
	case "null":
		return v == nil
	case "number":
		_, ok := v.(json.Number)
		return ok
	case "integer":
		n, ok := v.(json.Number)
		if !ok {
			return false
		}
		_, err := strconv.ParseInt(n.String(), 10, 64)
		return err == nil
	}
	return false
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
		if tw.web {
			return
		}
		// The server routes a cleaned API path; judge the answer by it.
		p := cleanAPIPath(r.Clone(r.Context())).URL.Path
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
		w.web = !strings.HasPrefix(w.Header().Get("Content-Type"), "application/json") && code < 400
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
