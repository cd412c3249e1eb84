package mcpserver

import (
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"reflect"
	"slices"
	"strings"
)

// decodeStrict decodes a tool's arguments into dst, a pointer to a struct
// whose json tags are the tool's argument names. Unlike encoding/json it
// matches names exactly (the schemas say additionalProperties: false, so
// "NETWORK" is an unknown argument, not network), refuses null inside
// lists and objects of strings, and says what is wrong in the arguments'
// own words rather than Go's types. null or a left-out argument leaves
// its field as it is.
func decodeStrict(raw json.RawMessage, dst any) error {
	if isNull(raw) {
		return nil
	}
	return decodeValue(raw, reflect.ValueOf(dst).Elem(), "")
}

func isNull(raw json.RawMessage) bool {
	s := strings.TrimSpace(string(raw))
	return s == "" || s == "null"
}

var unmarshalerType = reflect.TypeFor[json.Unmarshaler]()

// decodeValue decodes raw, not null, into v; name is the argument's path
// (files[0].path), "" for the arguments themselves.
func decodeValue(raw json.RawMessage, v reflect.Value, name string) error {
	if reflect.PointerTo(v.Type()).Implements(unmarshalerType) {
		// Its own words (networkArg).
		return v.Addr().Interface().(json.Unmarshaler).UnmarshalJSON(raw)
	}
	switch v.Kind() {
	case reflect.Pointer:
		// On an error the whole call is refused, so v may be left set.
		v.Set(reflect.New(v.Type().Elem()))
		return decodeValue(raw, v.Elem(), name)
	case reflect.Struct:
		var m map[string]json.RawMessage
		if json.Unmarshal(raw, &m) != nil || m == nil {
			if name == "" {
				return errors.New("the arguments must be an object")
			}
			return fmt.Errorf("%s must be an object", name)
		}
		fields := jsonFields(v.Type())
		for _, k := range slices.Sorted(maps.Keys(m)) {
			i, ok := fields[k]
			if !ok {
				// The words encoding/json used before, which agents may know.
				return fmt.Errorf("json: unknown field %q", k)
			}
			if isNull(m[k]) {
				continue
			}
			if err := decodeValue(m[k], v.Field(i), joinName(name, k)); err != nil {
				return err
			}
		}
		return nil
	case reflect.Slice:
		var elems []json.RawMessage
		if json.Unmarshal(raw, &elems) != nil || elems == nil {
			return fmt.Errorf("%s must be %s", name, typeWords(v.Type()))
		}
		s := reflect.MakeSlice(v.Type(), len(elems), len(elems))
		for i, e := range elems {
			if err := decodeElem(e, s.Index(i), fmt.Sprintf("%s[%d]", name, i)); err != nil {
				return err
			}
		}
		v.Set(s)
		return nil
	case reflect.Map:
		var m map[string]json.RawMessage
		if json.Unmarshal(raw, &m) != nil || m == nil {
			return fmt.Errorf("%s must be %s", name, typeWords(v.Type()))
		}
		out := reflect.MakeMapWithSize(v.Type(), len(m))
		for _, k := range slices.Sorted(maps.Keys(m)) {
			e := reflect.New(v.Type().Elem()).Elem()
			if err := decodeElem(m[k], e, fmt.Sprintf("%s[%s]", name, quoteKey(k))); err != nil {
				return err
			}
			out.SetMapIndex(reflect.ValueOf(k), e)
		}
		v.Set(out)
		return nil
	}
	if json.Unmarshal(raw, v.Addr().Interface()) != nil {
		return fmt.Errorf("%s must be %s", name, typeWords(v.Type()))
	}
	return nil
}

// decodeElem decodes raw, an element of a list or an object of strings
// named at, into v: null is no element.
func decodeElem(raw json.RawMessage, v reflect.Value, at string) error {
	if isNull(raw) {
		return fmt.Errorf("%s must be %s", at, typeWords(v.Type()))
	}
	return decodeValue(raw, v, at)
}

// jsonFields maps the json names of t's fields to their indexes.
func jsonFields(t reflect.Type) map[string]int {
	out := make(map[string]int, t.NumField())
	for i := range t.NumField() {
		f := t.Field(i)
		name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
		if name == "-" || !f.IsExported() {
			continue
		}
		if name == "" {
			name = f.Name
		}
		out[name] = i
	}
	return out
}

func joinName(parent, k string) string {
	if parent == "" {
		return k
	}
	return parent + "." + k
}

// quoteKey is an object key as a message shows it, quoted and clipped.
func quoteKey(k string) string {
	b, _ := json.Marshal(clip(k, 40))
	return string(b)
}

// typeWords says what a value of type t must be, as an agent reads it.
func typeWords(t reflect.Type) string {
	switch t.Kind() {
	case reflect.Pointer:
		return typeWords(t.Elem())
	case reflect.String:
		return "a string"
	case reflect.Bool:
		return "true or false"
	case reflect.Int, reflect.Int64, reflect.Int32:
		return "an integer"
	case reflect.Float64, reflect.Float32:
		return "a number"
	case reflect.Struct:
		return "an object"
	case reflect.Slice:
		if t.Elem().Kind() == reflect.String {
			return "an array of strings"
		}
		return "an array of objects"
	case reflect.Map:
		return "an object of strings"
	}
	return "of another type"
}
