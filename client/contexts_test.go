package client_test

import (
	"context"
	"errors"
	"testing"

	"github.com/kuboprotocol/vertal2kubo/client"
)

// TestCodeContextsSDK: cells keep state in a context, results and errors
// come back typed, and streams yield the events then the end.
func TestCodeContextsSDK(t *testing.T) {
	ctx := context.Background()
	sb, _ := newSandbox(t)
	if r, err := sb.RunCode(ctx, "x = 41"); err != nil || r.Status != client.StatusSucceeded || r.Text() != "" || r.ContextID == "" {
		t.Fatalf("set: %+v %v", r, err)
	}
	r, err := sb.RunCode(ctx, "x")
	if err != nil || r.Text() != "41" || r.ExecutionCount != 2 {
		t.Fatalf("state: %+v %v", r, err)
	}
	dflt := r.ContextID
	r, err = sb.RunCode(ctx, "raise ValueError")
	if err != nil || r.Status != client.StatusFailed || r.Error == nil || r.Error.Name != "ValueError" {
		t.Fatalf("raise: %+v %v", r, err)
	}

	js, err := sb.Contexts.Create(ctx, "javascript", "")
	if err != nil || js.Language != "javascript" || js.Default {
		t.Fatalf("create: %+v %v", js, err)
	}
	if r, err = sb.RunCode(ctx, "x", client.InContext(js.ID)); err != nil || r.Text() != "x" || r.ContextID != js.ID {
		t.Fatalf("contexts are apart: %+v %v", r, err)
	}
	list, err := sb.Contexts.List(ctx)
	if err != nil || len(list) != 2 || list[0].ID != dflt || !list[0].Default {
		t.Fatalf("list: %+v %v", list, err)
	}
	var types []client.EventType
	var end *client.CodeResult
	for ev, err := range sb.StreamCode(ctx, "print(hi)", client.InContext(dflt)) {
		if err != nil {
			t.Fatal(err)
		}
		types = append(types, ev.Type)
		if ev.Type == client.EventStdout && ev.Text != "hi\n" {
			t.Errorf("stdout %q", ev.Text)
		}
		end = ev.End
	}
	if len(types) != 2 || types[0] != client.EventStdout || types[1] != client.EventEnd || end == nil || end.Stdout != "hi\n" {
		t.Fatalf("stream %v %+v", types, end)
	}
	for ev, err := range sb.StreamCode(ctx, "raise KeyError") {
		if err != nil {
			t.Fatal(err)
		}
		if ev.Type == client.EventError && (ev.CodeError == nil || ev.CodeError.Name != "KeyError") {
			t.Errorf("error event %+v", ev)
		}
	}
	if _, err := sb.Contexts.Restart(ctx, dflt); err != nil {
		t.Fatal(err)
	}
	if r, _ = sb.RunCode(ctx, "x"); r.Text() != "x" {
		t.Errorf("state after restart: %+v", r)
	}
	if err := sb.Contexts.Delete(ctx, js.ID); err != nil {
		t.Fatal(err)
	}
	_, err = sb.RunCode(ctx, "1", client.InContext(js.ID))
	var ae *client.Error
	if !errors.As(err, &ae) || ae.Code != "not_found" {
		t.Fatalf("a deleted context: %v", err)
	}
	for _, err := range sb.StreamCode(ctx, "crash") {
		if !errors.As(err, &ae) || ae.Code != "sandbox_error" {
			t.Fatalf("a platform failure in a stream: %v", err)
		}
	}
}
