package api

import (
	"encoding/json"
	"fmt"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/kuboprotocol/vertal2kubo/client/wire"
	"github.com/kuboprotocol/vertal2kubo/internal/execution"
)

// TestWireMatchesOpenAPI holds the Go definition of the wire (package
// client/wire, which the server encodes and decodes and the client sends
// and reads) to the OpenAPI document: each schema's properties are the
// JSON fields of its Go type, a required property is never left out
// (no omitempty), a property that may be null is a pointer, a slice or a
// map, and each value has the JSON type the schema says. It compares
// shapes, not bytes, so descriptions and examples may change freely.
func TestWireMatchesOpenAPI(t *testing.T) {
	var doc struct {
		Components struct {
			Schemas map[string]*schema `json:"schemas"`
		} `json:"components"`
	}
	if err := json.Unmarshal(openAPISpec, &doc); err != nil {
		t.Fatal(err)
	}
	schemas := doc.Components.Schemas
	for name, v := range map[string]any{
		"ExecutionRequest": wire.ExecutionRequest{}, "InputFile": wire.File{}, "Execution": wire.Execution{},
		"ExecutionUsage": wire.ExecutionUsage{}, "ReturnedFile": wire.ReturnedFile{}, "WebhookDelivery": wire.Webhook{},
		"BatchRequest": wire.BatchRequest{}, "BatchResponse": wire.BatchResponse{}, "Error": wire.Error{},
		"SandboxRequest": wire.SandboxRequest{}, "SandboxFile": wire.File{}, "Sandbox": wire.Sandbox{}, "SandboxLimits": wire.SandboxLimits{},
		"SandboxList": wire.SandboxList{}, "SandboxTimeoutRequest": wire.SandboxTimeoutRequest{}, "CommandRequest": wire.CommandRequest{},
		"CommandResult": wire.CommandResult{}, "Command": wire.Command{}, "CommandList": wire.CommandList{}, "StdinRequest": wire.StdinRequest{},
		"SignalRequest": wire.SignalRequest{}, "FileEntry": wire.FileEntry{}, "FileList": wire.FileList{}, "PathRequest": wire.PathRequest{},
		"MoveRequest": wire.MoveRequest{}, "Ack": wire.Ack{},
		"ContextRequest": wire.ContextRequest{}, "Context": wire.Context{}, "ContextList": wire.ContextList{},
		"RunCodeRequest": wire.RunCodeRequest{}, "RunCodeResult": wire.RunCodeResult{}, "CodeOutput": wire.CodeOutput{}, "CodeError": wire.CodeError{},
		"Usage": wire.Usage{}, "RotatedKey": wire.KeyRotation{}, "WebhookSecret": wire.WebhookSecret{}, "Health": wire.Health{},
		// Languages and images are written from the execution service's
		// types, which are not in package wire yet.
		"LanguageList": struct {
			Languages []execution.LanguageInfo `json:"languages"`
		}{},
		"ImageList": struct {
			Images []execution.ImageInfo `json:"images"`
		}{},
	} {
		s, ok := schemas[name]
		if !ok {
			t.Errorf("openapi.json has no schema %s", name)
			continue
		}
		checkShape(t, schemas, name, s, reflect.TypeOf(v))
	}
	types := func(ts ...reflect.Type) []reflect.Type { return ts }
	// The data of an execution's events: started, stdout/stderr, result,
	// error.
	checkEvents(t, schemas, "ExecutionEvent",
		types(reflect.TypeFor[wire.StartedEvent]()), types(reflect.TypeFor[wire.OutputEvent]()),
		types(reflect.TypeFor[wire.Execution]()), types(reflect.TypeFor[wire.Error]()))
	// A command's events: stdout/stderr, exit, result, error.
	checkEvents(t, schemas, "CommandEvent",
		types(reflect.TypeFor[wire.OutputEvent]()), types(reflect.TypeFor[wire.ExitEvent]()),
		types(reflect.TypeFor[wire.CommandResult]()), types(reflect.TypeFor[wire.Error]()))
	// A cell's events: stdout/stderr, result, error (what the cell raised,
	// or the platform's failure), end.
	checkEvents(t, schemas, "CodeEvent",
		types(reflect.TypeFor[wire.OutputEvent]()), types(reflect.TypeFor[wire.CodeOutput]()),
		types(reflect.TypeFor[wire.CodeError](), reflect.TypeFor[wire.Error]()), types(reflect.TypeFor[wire.RunCodeResult]()))
}

// checkEvents holds the oneOf schema name, one event per alternative in
// order, to Go types: each event's data is of the one type given for it,
// or, where several are given, is a oneOf of exactly those, in order.
func checkEvents(t *testing.T, schemas map[string]*schema, name string, events ...[]reflect.Type) {
	t.Helper()
	s, ok := schemas[name]
	if !ok || len(s.OneOf) != len(events) {
		t.Fatalf("%s is not the oneOf of %d events", name, len(events))
	}
	for i, alts := range events {
		at := fmt.Sprintf("%s.oneOf[%d].data", name, i)
		data := s.OneOf[i].Properties["data"]
		switch {
		case data == nil:
			t.Errorf("%s is missing", at)
		case len(alts) == 1:
			checkShape(t, schemas, at, data, alts[0])
		case len(data.OneOf) != len(alts):
			t.Errorf("%s is not the oneOf of %d types", at, len(alts))
		default:
			for j, typ := range alts {
				checkShape(t, schemas, fmt.Sprintf("%s.oneOf[%d]", at, j), data.OneOf[j], typ)
			}
		}
	}
}

// schema is the part of a JSON Schema the test reads.
type schema struct {
	Ref                  string             `json:"$ref"`
	Type                 any                `json:"type"` // a name or a list of names
	Properties           map[string]*schema `json:"properties"`
	Required             []string           `json:"required"`
	Items                *schema            `json:"items"`
	AdditionalProperties any                `json:"additionalProperties"`
	OneOf                []*schema          `json:"oneOf"`
	AnyOf                []*schema          `json:"anyOf"`
}

// resolve follows $ref and splits "X or null" into X and nullable.
func (s *schema) resolve(schemas map[string]*schema) (out *schema, nullable bool) {
	for {
		if name, ok := strings.CutPrefix(s.Ref, "#/components/schemas/"); ok && schemas[name] != nil {
			s = schemas[name]
			continue
		}
		alts := s.OneOf
		if len(alts) == 0 {
			alts = s.AnyOf
		}
		var rest []*schema
		for _, a := range alts {
			if a.types() != nil && slices.Equal(a.types(), []string{"null"}) {
				nullable = true
			} else {
				rest = append(rest, a)
			}
		}
		if nullable && len(rest) == 1 {
			s = rest[0]
			continue
		}
		if slices.Contains(s.types(), "null") {
			nullable = true
		}
		return s, nullable
	}
}

func (s *schema) types() []string {
	switch t := s.Type.(type) {
	case string:
		return []string{t}
	case []any:
		var out []string
		for _, v := range t {
			out = append(out, v.(string))
		}
		return out
	}
	return nil
}

// mainType is the schema's type other than null.
func (s *schema) mainType() string {
	for _, t := range s.types() {
		if t != "null" {
			return t
		}
	}
	if len(s.Properties) > 0 {
		return "object"
	}
	return ""
}

func checkShape(t *testing.T, schemas map[string]*schema, at string, s *schema, typ reflect.Type) {
	t.Helper()
	s, _ = s.resolve(schemas)
	for typ.Kind() == reflect.Pointer {
		typ = typ.Elem()
	}
	if typ == reflect.TypeFor[time.Time]() && s.mainType() == "string" {
		return // RFC 3339
	}
	want := map[string]reflect.Kind{"string": reflect.String, "boolean": reflect.Bool, "array": reflect.Slice}[s.mainType()]
	switch s.mainType() {
	case "integer":
		if !slices.Contains([]reflect.Kind{reflect.Int, reflect.Int64}, typ.Kind()) {
			t.Errorf("%s: schema says integer, Go has %s", at, typ)
		}
		return
	case "number":
		if typ.Kind() != reflect.Float64 {
			t.Errorf("%s: schema says number, Go has %s", at, typ)
		}
		return
	case "object":
		if len(s.Properties) == 0 {
			if typ.Kind() != reflect.Map || typ.Key().Kind() != reflect.String {
				t.Errorf("%s: schema says a map, Go has %s", at, typ)
			}
			return
		}
		if typ.Kind() != reflect.Struct {
			t.Errorf("%s: schema says an object, Go has %s", at, typ)
			return
		}
		checkFields(t, schemas, at, s, typ)
		return
	case "":
		return // any value
	}
	if typ.Kind() != want {
		t.Errorf("%s: schema says %s, Go has %s", at, s.mainType(), typ)
		return
	}
	if want == reflect.Slice && s.Items != nil {
		checkShape(t, schemas, at+"[]", s.Items, typ.Elem())
	}
}

func checkFields(t *testing.T, schemas map[string]*schema, at string, s *schema, typ reflect.Type) {
	t.Helper()
	fields := map[string]reflect.StructField{}
	for i := range typ.NumField() {
		if f := typ.Field(i); jsonName(f) != "" {
			fields[jsonName(f)] = f
		}
	}
	for name := range fields {
		if _, ok := s.Properties[name]; !ok {
			t.Errorf("%s: Go field %s.%s (%q) is not in the schema", at, typ.Name(), fields[name].Name, name)
		}
	}
	for name, p := range s.Properties {
		f, ok := fields[name]
		if !ok {
			t.Errorf("%s: property %q has no field in Go type %s", at, name, typ)
			continue
		}
		_, opts, _ := strings.Cut(f.Tag.Get("json"), ",")
		omitted := slices.Contains(strings.Split(opts, ","), "omitempty") || slices.Contains(strings.Split(opts, ","), "omitzero")
		if slices.Contains(s.Required, name) && omitted {
			t.Errorf("%s: property %q is required but %s.%s is omitempty", at, name, typ.Name(), f.Name)
		}
		ps, nullable := p.resolve(schemas)
		if nullable && !slices.Contains([]reflect.Kind{reflect.Pointer, reflect.Slice, reflect.Map}, f.Type.Kind()) {
			t.Errorf("%s: property %q may be null but %s.%s is a %s", at, name, typ.Name(), f.Name, f.Type)
		}
		// A request's pointers tell a field left out from a zero one.
		if !nullable && slices.Contains(s.Required, name) && f.Type.Kind() == reflect.Pointer && !strings.HasSuffix(typ.Name(), "Request") {
			t.Errorf("%s: property %q is never null but %s.%s is a pointer", at, name, typ.Name(), f.Name)
		}
		checkShape(t, schemas, at+"."+name, ps, f.Type)
	}
}
