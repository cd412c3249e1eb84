package api

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"reflect"
	"strings"
	"unicode/utf8"

	json "github.com/go-json-experiment/json"
	"github.com/go-json-experiment/json/jsontext"
	jsonv1 "github.com/go-json-experiment/json/v1"

	"github.com/kuboprotocol/vertal2kubo/client/wire"
)

// Request bodies are decoded by github.com/go-json-experiment/json (what
// encoding/json/v2 will be; Go 1.26 has it only behind GOEXPERIMENT),
// whose defaults are the strictness the API documents: names match
// exactly, a name given twice in an object is an error, unknown members
// are refused on request, and exactly one value may be read. What is ours
// is the messages: each library error is turned back into the sentence
// (and field path) the API has always answered, so that a client or an
// agent can fix its request.

// DecodeExecutionRequest decodes one body of POST /v1/executions as the API
// does, before the execution service checks the values: valid UTF-8 without
// a lone surrogate escape, exactly one JSON object, every field known and
// spelled exactly, no name given twice in any object, each value of its
// type. A refusal is an *Error whose message names the problem.
func DecodeExecutionRequest(body []byte) (wire.ExecutionRequest, error) {
	var in wire.ExecutionRequest
	if err := checkJSONText(body); err != nil {
		return in, err
	}
	return in, decodeRequest(body, &in, errTimeoutRange)
}

// errTimeoutRange answers a timeout_s beyond float64 when no plan says
// what the range is.
var errTimeoutRange = errorf(KindInvalidTimeout, "timeout_s is out of range")

// checkJSONContentType refuses a body that is not said to be UTF-8 JSON.
func checkJSONContentType(r *http.Request) error {
	ct := r.Header.Get("Content-Type")
	if ct == "" {
		return errorf(KindInvalidContentType, "Content-Type must be application/json")
	}
	mt, params, err := mime.ParseMediaType(ct)
	if err != nil || mt != "application/json" {
		return errorf(KindInvalidContentType, "Content-Type must be application/json, not %q", clip(ct, 60))
	}
	if cs, ok := params["charset"]; ok && !strings.EqualFold(cs, "utf-8") {
		return errorf(KindInvalidContentType, "the body must be UTF-8 JSON")
	}
	return nil
}

// readJSONBody reads a request's JSON body, at most limit bytes and at
// most decoded bytes once its escapes are decoded, within the server's body
// budget, and refuses text that is not valid Unicode. Call release once
// the body is decoded, also after an error.
func (s *Server) readJSONBody(w http.ResponseWriter, r *http.Request, limit, decoded int64) (body []byte, release func(), err error) {
	release = func() {}
	if err := checkJSONContentType(r); err != nil {
		return nil, release, err
	}
	body, release, err = s.readBody(w, r, limit)
	if err != nil {
		return nil, release, err
	}
	if n := decodedSize(body); n > decoded {
		return nil, release, errorf(KindPayloadTooLarge, "request body holds %d bytes once its escapes are decoded; the plan's caps allow %d", n, decoded)
	}
	return body, release, checkJSONText(body)
}

// checkJSONText refuses bytes that are not valid UTF-8 and escaped
// surrogates without their pair, each with its offset: replacing either
// with U+FFFD, as a lenient decoder does, would silently change the
// program. The MCP endpoint holds its messages to the same rule.
func checkJSONText(body []byte) error {
	if i := invalidUTF8At(body); i >= 0 {
		return errorf(KindInvalidJSON, "request body is not valid UTF-8 (at byte %d)", i)
	}
	if i := LoneSurrogateAt(body); i >= 0 {
		return errorf(KindInvalidJSON, "request body has a lone surrogate escape (at byte %d); a string must be valid Unicode", i)
	}
	return nil
}

// decodeStrict decodes exactly one JSON object of body into v, refusing
// what DecodeExecutionRequest refuses.
func decodeStrict(body []byte, v any) error { return decodeRequest(body, v, nil) }

// decodeRequest is decodeStrict; tooLarge, when set, is the answer to a
// timeout_s beyond float64 (the plan's range), else a type error.
func decodeRequest(body []byte, v any, tooLarge *Error) error {
	if len(bytes.TrimSpace(body)) == 0 {
		return errorf(KindInvalidJSON, "request body is empty; send a JSON object")
	}
	// The syntax of the whole value first, as one problem is named: a
	// syntax error anywhere wins over a wrong field before it. Names given
	// twice and the text's Unicode are the unmarshal's (and checkJSONText's).
	dec := jsontext.NewDecoder(bytes.NewReader(body), jsontext.AllowDuplicateNames(true), jsontext.AllowInvalidUTF8(true))
	val, err := dec.ReadValue()
	var syntax *jsontext.SyntacticError
	switch {
	case errors.Is(err, io.ErrUnexpectedEOF):
		return errorf(KindInvalidJSON, "request body is not valid JSON (it ends too early)")
	case errors.As(err, &syntax):
		return errorf(KindInvalidJSON, "request body is not valid JSON (at byte %d)", syntax.ByteOffset)
	case err != nil:
		return errorf(KindInvalidJSON, "request body is not valid JSON")
	}
	// null unmarshals into a struct as nothing at all; a request is an
	// object (the fuzz target FuzzDecodeExecutionBody found it).
	if val.Kind() != '{' {
		return errorf(KindInvalidRequest, "request body must be a JSON object")
	}
	// Then in two passes, so that the problem named is the one it always
	// was: first the values' types and the unknown fields, with names
	// matched in any case and repeats let through; then the names exactly
	// as spelled, none twice, as a proxy or a log that reads the first
	// "code" must not see another program than the one that runs.
	root := reflect.TypeOf(v).Elem()
	if err := json.Unmarshal(val, v, json.RejectUnknownMembers(true), json.MatchCaseInsensitiveNames(true),
		jsonv1.MatchCaseSensitiveDelimiter(true), jsontext.AllowDuplicateNames(true)); err != nil {
		return decodeError(root, err, tooLarge)
	}
	reflect.ValueOf(v).Elem().SetZero()
	if err := json.Unmarshal(val, v, json.RejectUnknownMembers(true)); err != nil {
		return decodeError(root, err, tooLarge)
	}
	if _, err := dec.ReadToken(); err != io.EOF {
		return errorf(KindInvalidJSON, "request body has data after the JSON object")
	}
	return nil
}

// decodeError turns an error of unmarshaling into root into the message
// the API answers.
func decodeError(root reflect.Type, err error, tooLarge *Error) error {
	var syntax *jsontext.SyntacticError
	var sem *json.SemanticError
	switch {
	case errors.As(err, &syntax) && errors.Is(err, jsontext.ErrDuplicateName):
		at := walkPointer(root, syntax.JSONPointer.Parent())
		return errorf(KindInvalidRequest, "%s%sfield %s is given more than once", at.item, at.where, syntax.JSONPointer.LastToken())
	case errors.As(err, &sem) && errors.Is(err, json.ErrUnknownName):
		name := sem.JSONPointer.LastToken()
		at := walkPointer(root, sem.JSONPointer.Parent())
		allowed := jsonNames(at.typ)
		execRoot := root == reflect.TypeFor[wire.ExecutionRequest]() || root == reflect.TypeFor[wire.BatchRequest]()
		if execRoot && at.typ != reflect.TypeFor[wire.BatchRequest]() && !containsFold(allowed, name) {
			// Not a known field in another case: the fields of a request.
			return errorf(KindInvalidRequest, "%sunknown field %q; allowed: %s (and path, content, encoding in a file; allow in network)",
				at.item, name, strings.Join(executionFields, ", "))
		}
		return errorf(KindInvalidRequest, "%s%sunknown field %q; allowed: %s (lower case)", at.item, at.where, clip(name, 40), strings.Join(allowed, ", "))
	case errors.As(err, &sem):
		at := walkPointer(root, sem.JSONPointer)
		switch {
		case at.field == "":
			return errorf(KindInvalidRequest, "%srequest body must be a JSON object", at.item)
		case at.field == "timeout_s" && sem.JSONKind == '0' && tooLarge != nil:
			// A number too large for a float64.
			if at.item == "" {
				return tooLarge
			}
			return prefixError(tooLarge, at.item)
		}
		msg := fmt.Sprintf("%sfield %s must be %s, not %s", at.item, at.field, jsonTypeName(sem.GoType), kindName(sem.JSONKind))
		return &Error{Kind: KindInvalidRequest, Msg: msg, Err: err}
	}
	return errorf(KindInvalidJSON, "request body is not valid JSON")
}

// executionFields are the fields of an execution request, in order.
var executionFields = jsonNames(reflect.TypeFor[wire.ExecutionRequest]())

// place is where in a body a problem is, as the messages name it.
type place struct {
	item  string       // "executions[2]: " inside a batch, else ""
	field string       // struct fields from the request down, "files.path"
	where string       // the object as a prefix, "files[1]: "; "" at the top
	typ   reflect.Type // the Go type at the place
}

// walkPointer follows ptr from root through the Go types. Indices and map
// keys are left out of field, as encoding/json always named fields; an
// execution request inside a batch starts the names again, after its item.
func walkPointer(root reflect.Type, ptr jsontext.Pointer) place {
	p := place{typ: root}
	var where strings.Builder
	for tok := range ptr.Tokens() {
		for p.typ.Kind() == reflect.Pointer {
			p.typ = p.typ.Elem()
		}
		switch p.typ.Kind() {
		case reflect.Struct:
			f, ok := fieldByJSONName(p.typ, tok)
			if !ok {
				return p
			}
			p.typ = f.Type
			if p.field != "" {
				p.field += "."
				where.WriteString(".")
			}
			p.field += jsonName(f)
			where.WriteString(tok)
		case reflect.Slice:
			p.typ = p.typ.Elem()
			if p.typ == reflect.TypeFor[wire.ExecutionRequest]() {
				p.item, p.field = where.String()+"["+tok+"]: ", ""
				where.Reset()
				continue
			}
			where.WriteString("[" + tok + "]")
		case reflect.Map:
			p.typ = p.typ.Elem()
			where.WriteString("." + tok)
		default:
			return p
		}
	}
	for p.typ.Kind() == reflect.Pointer {
		p.typ = p.typ.Elem()
	}
	if where.Len() > 0 {
		p.where = where.String() + ": "
	}
	return p
}

// fieldByJSONName is the field of struct t named name on the wire, or
// named so in another case.
func fieldByJSONName(t reflect.Type, name string) (reflect.StructField, bool) {
	for i := range t.NumField() {
		if f := t.Field(i); jsonName(f) == name {
			return f, true
		}
	}
	for i := range t.NumField() {
		if f := t.Field(i); strings.EqualFold(jsonName(f), name) {
			return f, true
		}
	}
	return reflect.StructField{}, false
}

// jsonNames are the wire names of struct t's fields, in order; none for
// another type.
func jsonNames(t reflect.Type) []string {
	if t.Kind() != reflect.Struct {
		return nil
	}
	var out []string
	for i := range t.NumField() {
		if n := jsonName(t.Field(i)); n != "" {
			out = append(out, n)
		}
	}
	return out
}

// jsonName is f's name on the wire, "" when it has none.
func jsonName(f reflect.StructField) string {
	name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
	if name == "-" || !f.IsExported() {
		return ""
	}
	if name == "" {
		return f.Name
	}
	return name
}

func containsFold(names []string, name string) bool {
	for _, n := range names {
		if strings.EqualFold(n, name) {
			return true
		}
	}
	return false
}

// jsonTypeName says what a Go type takes on the wire.
func jsonTypeName(t reflect.Type) string {
	if t == nil {
		return "of another type"
	}
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	switch t.Kind() {
	case reflect.String:
		return "a string"
	case reflect.Float64, reflect.Int, reflect.Int64:
		return "a number"
	case reflect.Bool:
		return "a boolean"
	case reflect.Slice:
		return "an array"
	case reflect.Map:
		if t.Key().Kind() == reflect.String && t.Elem().Kind() == reflect.String {
			return "an object of strings"
		}
	}
	return "of another type"
}

// kindName names the JSON value that was sent.
func kindName(k jsontext.Kind) string {
	switch k {
	case '"':
		return "string"
	case '0':
		return "number"
	case 't', 'f':
		return "bool"
	case '[':
		return "array"
	case '{':
		return "object"
	}
	return "null"
}

// invalidUTF8At returns the offset of the first byte that is not valid
// UTF-8, or -1.
func invalidUTF8At(b []byte) int {
	if utf8.Valid(b) {
		return -1
	}
	for i := 0; i < len(b); {
		r, size := utf8.DecodeRune(b[i:])
		if r == utf8.RuneError && size == 1 {
			return i
		}
		i += size
	}
	return -1
}

// LoneSurrogateAt returns the offset of the first \u escape in a JSON
// string of b that is a UTF-16 surrogate without its pair (a high one not
// followed by a low one, or a low one alone), or -1. b need not be valid
// JSON; the decoder reports that.
func LoneSurrogateAt(b []byte) int {
	if !bytes.Contains(b, []byte(`\u`)) {
		return -1
	}
	inString := false
	for i := 0; i < len(b); i++ {
		switch c := b[i]; {
		case !inString:
			inString = c == '"'
		case c == '"':
			inString = false
		case c != '\\':
		case i+1 < len(b) && b[i+1] != 'u':
			i++ // a one-character escape such as \\ or \"
		default:
			r, ok := hex4(b, i+2)
			if !ok {
				i++
				continue
			}
			switch {
			case r >= 0xDC00 && r <= 0xDFFF:
				return i
			case r >= 0xD800 && r <= 0xDBFF:
				lo, ok := hex4(b, i+8)
				if !ok || i+7 >= len(b) || b[i+6] != '\\' || b[i+7] != 'u' || lo < 0xDC00 || lo > 0xDFFF {
					return i
				}
				i += 11
			default:
				i += 5
			}
		}
	}
	return -1
}

// hex4 decodes the four hex digits at b[i:].
func hex4(b []byte, i int) (rune, bool) {
	if i < 0 || i+4 > len(b) {
		return 0, false
	}
	var r rune
	for _, c := range b[i : i+4] {
		switch {
		case c >= '0' && c <= '9':
			r = r<<4 | rune(c-'0')
		case c >= 'a' && c <= 'f':
			r = r<<4 | rune(c-'a'+10)
		case c >= 'A' && c <= 'F':
			r = r<<4 | rune(c-'A'+10)
		default:
			return 0, false
		}
	}
	return r, true
}
