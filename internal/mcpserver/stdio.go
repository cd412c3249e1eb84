package mcpserver

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"sync"

	"github.com/kuboprotocol/vertal2kubo/client"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// ServeStdio serves MCP on r and w (newline-delimited JSON-RPC) until r
// ends or ctx is cancelled. When r ends, the requests already read are
// answered first: `echo '<request>' | vertal mcp` prints its answer.
func ServeStdio(ctx context.Context, c *client.Client, r io.Reader, w io.Writer, opts Options) error {
	s := New(ctx, c, opts)
	t := &answerBeforeEOF{Transport: &mcp.IOTransport{Reader: io.NopCloser(r), Writer: nopWriteCloser{w}}}
	err := s.Run(ctx, t)
	if err != nil && (errors.Is(err, io.EOF) || errors.Is(err, context.Canceled) || errors.Is(err, mcp.ErrConnectionClosed)) {
		return nil
	}
	return err
}

type nopWriteCloser struct{ io.Writer }

func (nopWriteCloser) Close() error { return nil }

// answerBeforeEOF is a transport whose connection holds back the end of
// its input until every request it read has been answered.
//
// The SDK (v1.8.0, modelcontextprotocol/go-sdk#1061) treats the end of
// stdin as the end of the connection: it cancels the requests in flight
// and refuses to write their answers, so a client that closes its side
// right after its last request, as a shell pipe does, gets nothing. Ending
// the input only once nothing is owed keeps the SDK's shutdown as it is
// and loses no answer.
type answerBeforeEOF struct{ mcp.Transport }

func (t *answerBeforeEOF) Connect(ctx context.Context) (mcp.Connection, error) {
	c, err := t.Transport.Connect(ctx)
	if err != nil {
		return nil, err
	}
	return &drainingConn{Connection: c, owed: map[jsonrpc.ID]bool{}, answered: make(chan struct{}, 1),
		closed: make(chan struct{})}, nil
}

type drainingConn struct {
	mcp.Connection

	mu   sync.Mutex
	owed map[jsonrpc.ID]bool // requests read and not yet answered
	// answered gets a token after each answer; one reader waits on it.
	answered  chan struct{}
	closed    chan struct{}
	closeOnce sync.Once
}

func (c *drainingConn) Read(ctx context.Context) (jsonrpc.Message, error) {
	msg, err := c.Connection.Read(ctx)
	if err == nil {
		if req, ok := msg.(*jsonrpc.Request); ok {
			c.track(req)
		}
		return msg, nil
	}
	if !errors.Is(err, io.EOF) {
		return nil, err
	}
	for {
		c.mu.Lock()
		n := len(c.owed)
		c.mu.Unlock()
		if n == 0 {
			return nil, err
		}
		select {
		case <-c.answered:
		case <-c.closed:
			return nil, err
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
}

// track notes a call the server owes an answer, or forgets one the client
// cancelled (an answer to it may never be written).
func (c *drainingConn) track(req *jsonrpc.Request) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if req.IsCall() {
		c.owed[req.ID] = true
		return
	}
	if req.Method != "notifications/cancelled" {
		return
	}
	var p struct {
		RequestID any `json:"requestId"`
	}
	if json.Unmarshal(req.Params, &p) != nil {
		return
	}
	if id, err := jsonrpc.MakeID(p.RequestID); err == nil {
		delete(c.owed, id)
	}
}

func (c *drainingConn) Write(ctx context.Context, msg jsonrpc.Message) error {
	err := c.Connection.Write(ctx, msg)
	if resp, ok := msg.(*jsonrpc.Response); ok {
		c.mu.Lock()
		delete(c.owed, resp.ID)
		c.mu.Unlock()
		select {
		case c.answered <- struct{}{}:
		default:
		}
	}
	return err
}

func (c *drainingConn) Close() error {
	c.closeOnce.Do(func() { close(c.closed) })
	return c.Connection.Close()
}
