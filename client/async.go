package client

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/http"
	"path"
	"time"

	"github.com/kuboprotocol/vertal2kubo/client/wire"
)

// Waits between two GETs of an execution when Wait polls: doubling from
// firstBackoff up to maxPollWait.
const maxPollWait = 5 * time.Second

// WithWebhook asks the server to POST the execution's final result to url
// (https; see Webhooks in docs/API.md) once it ends, signed with the
// tenant's webhook secret. It is for Submit and for BatchItem.WebhookURL;
// Run and Stream refuse it, since a synchronous run answers the result
// itself.
func WithWebhook(url string) RunOption {
	return func(r *runRequest) { r.WebhookURL = nonEmpty(url) }
}

// Submit accepts code for an asynchronous run and returns at once,
// without waiting for it: the server answers 202 with the execution
// queued (its quota already reserved). Follow it with Wait, Get or Attach,
// or let WithWebhook deliver the result.
//
// Submit takes the options of Run. Like Run it always sends an
// Idempotency-Key, so its retries (and, with WithIdempotencyKey, a repeat
// from another process) never queue the code twice; a repeat answers the
// execution of the first request, in whatever state it is by then.
func (c *Client) Submit(ctx context.Context, code string, opts ...RunOption) (*Execution, error) {
	cl, err := c.runCallAsync(code, opts, true)
	if err != nil {
		return nil, err
	}
	return c.accepted(ctx, cl)
}

// accepted sends a Submit and checks that its answer names an execution:
// by its id, or else by the Location header of the 202.
func (c *Client) accepted(ctx context.Context, cl call) (*Execution, error) {
	var (
		ex     Execution
		header http.Header
	)
	cl.decodes, cl.gotHeader = &ex, &header
	raw, err := c.do(ctx, cl)
	if err != nil {
		return nil, err
	}
	if ex.ID == "" {
		if loc := header.Get("Location"); loc != "" {
			ex.ID = path.Base(loc)
		}
	}
	if ex.ID == "" {
		return nil, errors.New("vertal: submit answered without an execution id")
	}
	ex.Raw = raw
	return &ex, nil
}

// Wait returns the execution with this id once it is final (any status
// but queued and running). It follows the execution's event stream
// (Attach), so it learns of the end at once; if the stream cannot be
// had or breaks for good, it polls GET /v1/executions/{id}, waiting
// longer between tries up to 5 seconds. It gives up only when ctx is done
// or the API refuses the GET (an unknown id is ErrNotFound).
func (c *Client) Wait(ctx context.Context, id string) (*Execution, error) {
	if id == "" {
		return nil, errors.New("vertal: empty execution id")
	}
	for ev, err := range c.Attach(ctx, id, "") {
		if err != nil {
			break // an error event or a lost stream: the store has the truth
		}
		if ev.Type == EventResult && ev.Execution.Status.Final() {
			return ev.Execution, nil
		}
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	for n := 0; ; n++ {
		ex, err := c.Get(ctx, id)
		if err != nil {
			return nil, err
		}
		if ex.Status.Final() {
			return ex, nil
		}
		if err := c.sleep(ctx, pollWait(n)); err != nil {
			return nil, err
		}
	}
}

// pollWait is the wait after the n-th GET of a poll that found the
// execution unfinished: exponential with jitter, capped at maxPollWait.
func pollWait(n int) time.Duration {
	d := firstBackoff << min(n, 10)
	d += time.Duration(rand.Int64N(int64(d)/4 + 1))
	return min(d, maxPollWait)
}

// BatchItem is one execution of a Batch: its code and the options Run
// takes, as fields. The zero value of each option is the server's default.
type BatchItem struct {
	Code string
	// Image is the server's default when empty.
	Image string
	// Language is "python" when empty.
	Language string
	// Timeout is the wall-clock limit; 0 means the server's default.
	Timeout     time.Duration
	Stdin       string
	Files       []File
	Env         map[string]string
	Args        []string
	ReturnFiles []string
	// WebhookURL receives this item's result; it wins over the batch's
	// WithBatchWebhook.
	WebhookURL string
	// Network is what the item's program may reach, as WithNetwork sets
	// it: nil takes the plan's allowlist (none on the built-in plans), an
	// empty Allow asks for no network.
	Network *wire.NetworkRequest
}

// options turns the item into the options of one run, so an item is
// encoded exactly as Submit encodes the same run.
func (it BatchItem) options() []RunOption {
	opts := []RunOption{WithFiles(it.Files...), WithEnv(it.Env), WithArgs(it.Args...), WithReturnFiles(it.ReturnFiles...), WithStdin(it.Stdin)}
	if it.Image != "" {
		opts = append(opts, WithImage(it.Image))
	}
	if it.Language != "" {
		opts = append(opts, WithLanguage(it.Language))
	}
	if it.Timeout != 0 {
		opts = append(opts, WithTimeout(it.Timeout))
	}
	if it.WebhookURL != "" {
		opts = append(opts, WithWebhook(it.WebhookURL))
	}
	if it.Network != nil {
		opts = append(opts, WithNetwork(it.Network.Allow...))
	}
	return opts
}

// batchRequest is the body of POST /v1/executions/batch.
type batchRequest struct {
	wire.BatchRequest

	idempotencyKey string
}

// BatchOption configures one Batch.
type BatchOption func(*batchRequest)

// WithBatchWebhook sends the result of every item without a WebhookURL
// of its own to url.
func WithBatchWebhook(url string) BatchOption {
	return func(b *batchRequest) { b.WebhookURL = nonEmpty(url) }
}

// WithBatchIdempotencyKey makes a Batch safe to repeat across processes,
// as WithIdempotencyKey does for a run: the same key with the same batch
// answers the executions of the first request instead of queuing them
// again. Without it Batch generates a key per call.
func WithBatchIdempotencyKey(key string) BatchOption {
	return func(b *batchRequest) { b.idempotencyKey = key }
}

// newBatchRequest applies the options to a batch of items, each encoded
// as Submit encodes the same run.
func newBatchRequest(items []BatchItem, opts []BatchOption) batchRequest {
	req := batchRequest{BatchRequest: wire.BatchRequest{Executions: make([]wire.ExecutionRequest, len(items))}}
	for i, it := range items {
		req.Executions[i] = newRunRequest(it.Code, it.options()).ExecutionRequest
	}
	for _, o := range opts {
		o(&req)
	}
	return req
}

// Batch submits up to 20 executions at once (POST /v1/executions/batch)
// and returns them queued, in the order of items. The server takes all of
// them or none: an invalid item is refused as an *Error (400
// invalid_request) whose Message names it by index, e.g.
// "executions[3].language: ...", and a batch that does not fit in the
// day's quota is refused whole (ErrQuotaExceeded). Retries and the
// Idempotency-Key work as for Submit.
func (c *Client) Batch(ctx context.Context, items []BatchItem, opts ...BatchOption) ([]*Execution, error) {
	if len(items) == 0 {
		return nil, errors.New("vertal: a batch needs at least one item")
	}
	req := newBatchRequest(items, opts)
	cl, err := c.postCall("/v1/executions/batch", req, req.idempotencyKey)
	if err != nil {
		return nil, err
	}
	var resp struct {
		Executions []json.RawMessage `json:"executions"`
	}
	cl.decodes = &resp
	if _, err := c.do(ctx, cl); err != nil {
		return nil, err
	}
	if len(resp.Executions) != len(items) {
		return nil, fmt.Errorf("vertal: batch of %d answered %d executions", len(items), len(resp.Executions))
	}
	out := make([]*Execution, len(items))
	for i, raw := range resp.Executions {
		var ex Execution
		if err := json.Unmarshal(raw, &ex); err != nil {
			return nil, fmt.Errorf("vertal: decoding executions[%d] of the batch: %w", i, err)
		}
		out[i] = &ex
	}
	return out, nil
}
