package api

import (
	"errors"
	"net/http"
	"net/url"
	"reflect"
	"testing"

	"github.com/kuboprotocol/vertal2kubo/client/wire"
)

// FuzzDecodeSandboxBodies: every body of the sandbox routes is either
// refused with a 400 that says why, or decoded into a value that encodes
// and decodes back to the same encoding (an empty list or object and an
// absent one encode alike: omitempty).
func FuzzDecodeSandboxBodies(f *testing.F) {
	for _, seed := range []string{
		`{"image":"default","timeout_s":600,"env":{"A":"1"},"metadata":{"team":"ml"},"files":[{"path":"a","content":"aGk=","encoding":"base64"}],"on_timeout":"pause"}`,
		`{"cmd":"echo hi","cwd":"/tmp","env":{"X":"y"},"stdin":"in","timeout_s":5,"background":true}`,
		`{"argv":["ls","-la"]}`, `{"data":"x","eof":true}`, `{"signal":"TERM"}`, `{"path":"d"}`, `{"from":"a","to":"b"}`,
		`{"timeout_s":1e400}`, `{"cmd":"a","Cmd":"b"}`, `{"cmd":"a","cmd":"b"}`, `{"cmd":"\ud800"}`, `[]`, `null`, ``, `{`,
		`{"files":[{"path":"a","Path":"b"}]}`, `{"metadata":{"k":1}}`,
	} {
		f.Add([]byte(seed))
	}
	types := []reflect.Type{
		reflect.TypeFor[wire.SandboxRequest](), reflect.TypeFor[wire.SandboxTimeoutRequest](), reflect.TypeFor[wire.CommandRequest](),
		reflect.TypeFor[wire.StdinRequest](), reflect.TypeFor[wire.SignalRequest](), reflect.TypeFor[wire.PathRequest](), reflect.TypeFor[wire.MoveRequest](),
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		for _, typ := range types {
			v := reflect.New(typ).Interface()
			err := checkJSONText(body)
			if err == nil {
				err = decodeStrict(body, v)
			}
			if err != nil {
				var e *Error
				if !errors.As(err, &e) || kindStatus(e.Kind) != http.StatusBadRequest || e.Msg == "" {
					t.Fatalf("%s %q: error %#v, want a 400 with a message", typ.Name(), body, err)
				}
				continue
			}
			again := reflect.New(typ).Interface()
			if err := decodeStrict([]byte(jsonBody(v)), again); err != nil || jsonBody(again) != jsonBody(v) {
				t.Fatalf("%s %q: decoded %+v, which does not round-trip (%v)", typ.Name(), body, v, err)
			}
		}
	})
}

// FuzzListQuery: a list query is refused with a 400, or gives a request
// within the documented bounds.
func FuzzListQuery(f *testing.F) {
	for _, seed := range []string{"status=running&metadata.team=ml&limit=10&cursor=abc", "limit=0", "limit=101", "status=gone",
		"metadata.=x", "x=1", "limit=1&limit=2", "limit=+5", "limit=05", "%zz", "metadata.a=1&metadata.b="} {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, raw string) {
		q, err := url.ParseQuery(raw)
		if err != nil {
			return
		}
		req, err := listQuery(q)
		if err != nil {
			var e *Error
			if !errors.As(err, &e) || e.Kind != KindInvalidRequest || e.Msg == "" {
				t.Fatalf("%q: error %#v, want invalid_request", raw, err)
			}
			return
		}
		if req.Limit < 0 || req.Limit > 100 {
			t.Fatalf("%q: limit %d", raw, req.Limit)
		}
		switch req.Status {
		case "", "running", "paused", "ended":
		default:
			t.Fatalf("%q: status %q", raw, req.Status)
		}
		for k := range req.Metadata {
			if k == "" {
				t.Fatalf("%q: empty metadata key", raw)
			}
		}
	})
}
