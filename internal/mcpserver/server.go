// Package mcpserver offers Vertal Run to AI agents over the Model Context
// Protocol: a run_code tool and a get_usage tool, on stdio (`vertal mcp`)
// and on Streamable HTTP (mounted by the API server at /mcp).
//
// The tools call a Backend. On stdio (and for an HTTP handler given an
// APIURL) that is the HTTP API through the public Go SDK with the agent's
// own key; mounted inside the API server it is the execution service
// itself, with the caller the API authenticated (HTTPOptions.Backend). The
// sequence behind both is the same one (internal/execution), so quotas,
// idempotency and metering are exactly those of the API.
package mcpserver

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/kuboprotocol/vertal2kubo/client"
	"github.com/kuboprotocol/vertal2kubo/client/wire"
	"github.com/kuboprotocol/vertal2kubo/internal/egress"
	"github.com/kuboprotocol/vertal2kubo/internal/execution"
	"github.com/kuboprotocol/vertal2kubo/internal/logx"
	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// Options configure an MCP server.
type Options struct {
	// Version is reported to MCP clients as the server version.
	Version string
	// Logger receives diagnostics; nil discards them. It never receives
	// API keys or code.
	Logger *slog.Logger
	// Languages are listed, with versions, in the run_code description.
	// When nil they are asked of the API (GET /v1/languages) and a generic
	// list is used if that fails.
	Languages []client.Language
	// Images are listed, with their main packages, in the run_code
	// description. When nil they are asked of the API (GET /v1/images).
	Images []client.Image
}

func (o Options) logger() *slog.Logger {
	if o.Logger == nil {
		return slog.New(slog.DiscardHandler)
	}
	return o.Logger
}

// Backend is what the tools call. Errors the API would answer with are
// *client.Error, so an agent reads the same refusal either way.
type Backend interface {
	RunCode(ctx context.Context, req RunRequest) (*client.Execution, error)
	Usage(ctx context.Context) (*client.Usage, error)
}

// RunRequest is a run_code call.
type RunRequest struct {
	Image    string // "" for the default image
	Language string
	Code     string
	TimeoutS *float64 // nil: the plan's default
	Stdin    string
	// Files, Env, Args and ReturnFiles are the request fields of the same
	// names (docs/API.md); the execution service validates them.
	Files       []execution.InputFile
	Env         map[string]string
	Args        []string
	ReturnFiles []string
	// Network narrows the plan's egress allowlist: nil takes the plan's
	// (none on the built-in plans), an empty Allow asks for no network.
	Network *execution.NetworkRequest
}

// Input is req as the execution service takes it.
func (req RunRequest) Input() execution.Input {
	var img *string
	if req.Image != "" {
		img = &req.Image
	}
	return execution.Input{
		Image:       img,
		Language:    &req.Language,
		Code:        &req.Code,
		TimeoutS:    req.TimeoutS,
		Stdin:       &req.Stdin,
		Files:       req.Files,
		Env:         req.Env,
		Args:        req.Args,
		ReturnFiles: req.ReturnFiles,
		Network:     req.Network,
	}
}

// argError is a tool argument the stdio server refuses before calling
// the API.
type argError struct{ msg string }

func (e *argError) Error() string { return e.msg }

// ClientBackend is a Backend over the HTTP API.
func ClientBackend(c *client.Client) Backend { return clientBackend{c} }

type clientBackend struct{ c *client.Client }

func (b clientBackend) RunCode(ctx context.Context, req RunRequest) (*client.Execution, error) {
	opts := []client.RunOption{client.WithImage(req.Image), client.WithLanguage(req.Language),
		client.WithEnv(req.Env), client.WithArgs(req.Args...), client.WithReturnFiles(req.ReturnFiles...)}
	for i, f := range req.Files {
		content := []byte(f.Content)
		if f.Encoding == "base64" {
			b, err := base64.StdEncoding.Strict().DecodeString(f.Content)
			if err != nil {
				return nil, &argError{fmt.Sprintf("files[%d].content is not valid base64", i)}
			}
			content = b
		}
		opts = append(opts, client.WithFiles(client.File{Path: f.Path, Content: content}))
	}
	if req.TimeoutS != nil {
		opts = append(opts, client.WithTimeout(time.Duration(*req.TimeoutS*float64(time.Second))))
	}
	if req.Stdin != "" {
		opts = append(opts, client.WithStdin(req.Stdin))
	}
	if req.Network != nil {
		opts = append(opts, client.WithNetwork(req.Network.Allow...))
	}
	return b.c.Run(ctx, req.Code, opts...)
}

func (b clientBackend) Usage(ctx context.Context) (*client.Usage, error) { return b.c.Usage(ctx) }

// backendFunc returns the Backend a tool call must use.
type backendFunc func(ctx context.Context, req *mcp.CallToolRequest) (Backend, error)

// tools holds what the tool handlers share.
type tools struct {
	backendFor backendFunc
	// remote hides transport details (internal addresses) from callers on
	// the network; a local stdio user sees them.
	remote bool
	log    *slog.Logger
}

// newServer builds the MCP server with run_code and get_usage, and the
// sandbox tools too when withSandboxes is set.
func newServer(t *tools, langs []client.Language, images []client.Image, version string, withSandboxes bool) *mcp.Server {
	if version == "" {
		version = "dev"
	}
	instructions := "Vertal Run executes Python, JavaScript and Bash in a fresh isolated sandbox per call (no network unless the plan allows hosts, no package installs). Use run_code to run a complete program and get_usage to see the remaining daily quota and plan limits."
	if withSandboxes {
		instructions += sandboxInstructions
	}
	s := mcp.NewServer(&mcp.Implementation{Name: "vertal-run", Title: "Vertal Run", Version: version}, &mcp.ServerOptions{
		Logger: sdkLogger(t.log),
		// Only what both servers (this and sdk/python's) honour: tools,
		// whose list never changes. The SDK's defaults would add logging,
		// which no tool uses, and tools.listChanged, never sent.
		Capabilities: &mcp.ServerCapabilities{Tools: &mcp.ToolCapabilities{}},
		Instructions: instructions,
	})
	// By name, as GET /v1/languages lists them: the stdio server reads
	// that list, the HTTP one gets the server's configuration order.
	langs = slices.SortedFunc(slices.Values(langs), func(a, b client.Language) int { return strings.Compare(a.Name, b.Name) })
	s.AddTool(runCodeTool(langs, images, withSandboxes), t.runCode)
	s.AddTool(getUsageTool(), t.getUsage)
	if withSandboxes {
		addSandboxTools(s, t)
	}
	return s
}

// sdkLogger is l with the SDK's INFO lines demoted to DEBUG. The stateless
// HTTP handler makes a session per request, and the SDK logs "connecting",
// "connected" and "disconnected" for each: three lines a message that
// say nothing the access log does not.
func sdkLogger(l *slog.Logger) *slog.Logger { return slog.New(logx.DemoteInfo(l.Handler())) }

// New returns an MCP server whose tools call the API with c.
func New(ctx context.Context, c *client.Client, opts Options) *mcp.Server {
	langs, images := opts.Languages, opts.Images
	if langs == nil {
		langs = fetchLanguages(ctx, c, opts.logger())
	}
	if images == nil {
		images = fetchImages(ctx, c)
	}
	// The stdio server calls the API through the Go SDK, sandboxes too
	// when the API offers them.
	var b Backend = clientBackend{c}
	withSandboxes := offersSandboxes(ctx, c, opts.logger())
	if withSandboxes {
		b = clientSandboxes{clientBackend{c}}
	}
	t := &tools{
		backendFor: func(context.Context, *mcp.CallToolRequest) (Backend, error) { return b, nil },
		log:        opts.logger(),
	}
	return newServer(t, langs, images, opts.Version, withSandboxes)
}

// offersSandboxes asks the API whether it serves sandboxes that stay. Only
// a server that says it does not (404) loses the sandbox tools: one that
// cannot be reached now keeps them, and their calls say what is wrong.
func offersSandboxes(ctx context.Context, c *client.Client, log *slog.Logger) bool {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	_, err := c.ListSandboxes(ctx, client.ListParams{Limit: 1})
	var ce *client.Error
	if errors.As(err, &ce) && ce.StatusCode == http.StatusNotFound {
		log.Info("the server does not offer sandboxes; serving run_code and get_usage only")
		return false
	}
	return true
}

// fetchLanguages asks the API which languages it runs. It gives up quickly:
// the tools work without versions in their description.
func fetchLanguages(ctx context.Context, c *client.Client, log *slog.Logger) []client.Language {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	langs, err := c.Languages(ctx)
	if err != nil || len(langs) == 0 {
		log.Warn("could not list languages; describing run_code without versions", "err", err)
		return nil
	}
	return langs
}

// runArgs are run_code's arguments.
type runArgs struct {
	Image       string            `json:"image"`
	Language    string            `json:"language"`
	Code        string            `json:"code"`
	TimeoutS    *float64          `json:"timeout_s"`
	Stdin       string            `json:"stdin"`
	Files       []fileArg         `json:"files"`
	Env         map[string]string `json:"env"`
	Args        []string          `json:"args"`
	ReturnFiles []string          `json:"return_files"`
	Network     networkArg        `json:"network"`
	// A cell in a sandbox that stays (servers with sandboxes only).
	SandboxID string `json:"sandbox_id"`
	ContextID string `json:"context_id"`
}

// fileArg is one entry of run_code's files.
type fileArg struct {
	Path     string `json:"path"`
	Content  string `json:"content"`
	Encoding string `json:"encoding"`
}

func (a runArgs) request() RunRequest {
	req := RunRequest{Image: a.Image, Language: a.Language, Code: a.Code, TimeoutS: a.TimeoutS, Stdin: a.Stdin,
		Env: a.Env, Args: a.Args, ReturnFiles: a.ReturnFiles, Network: a.Network.request()}
	for _, f := range a.Files {
		req.Files = append(req.Files, execution.InputFile(f))
	}
	return req
}

func decodeRunArgs(raw json.RawMessage) (runArgs, error) {
	var a runArgs
	if len(raw) == 0 {
		return a, errors.New("arguments language and code are required")
	}
	if err := decodeStrict(raw, &a); err != nil {
		return a, fmt.Errorf("invalid arguments: %v", err)
	}
	switch {
	case strings.TrimSpace(a.Language) == "":
		return a, errors.New("argument language is required (python, javascript or bash)")
	case a.Code == "":
		return a, errors.New("argument code is required and must not be empty")
	case a.TimeoutS != nil && *a.TimeoutS < 1:
		return a, errors.New("argument timeout_s must be at least 1")
	}
	// Paths, sizes and names are the service's to check, with the same
	// messages as the API; only what the schema fixes is checked here.
	for i, f := range a.Files {
		switch {
		case f.Path == "":
			return a, fmt.Errorf("argument files[%d].path is required", i)
		case f.Encoding != "" && f.Encoding != "utf8" && f.Encoding != "base64":
			return a, fmt.Errorf("argument files[%d].encoding must be utf8 or base64, not %q", i, clip(f.Encoding, 20))
		}
	}
	return a, nil
}

func (t *tools) runCode(ctx context.Context, req *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
	args, err := decodeRunArgs(req.Params.Arguments)
	if err != nil {
		return errorResult(err.Error()), nil
	}
	b, err := t.backendFor(ctx, req)
	if err != nil {
		return errorResult(err.Error()), nil
	}
	if args.SandboxID != "" || args.ContextID != "" {
		return t.runCell(ctx, b, args)
	}
	ex, err := b.RunCode(ctx, args.request())
	var bad *argError
	if errors.As(err, &bad) {
		return errorResult(err.Error()), nil
	}
	if err != nil {
		return t.apiErrorResult(err, args.Network.hint(err)), nil
	}
	var structured map[string]any
	if err := json.Unmarshal(ex.Raw, &structured); err != nil {
		return nil, fmt.Errorf("decoding execution: %w", err)
	}
	files, truncated, err := returnedFiles(ex.Raw)
	if err != nil {
		return nil, err
	}
	content := []mcp.Content{&mcp.TextContent{Text: formatExecution(ex, filesLine(files, truncated))}}
	for _, f := range files {
		c, err := fileContent(ex.ID, f)
		if err != nil {
			return nil, err
		}
		content = append(content, c)
	}
	withoutFileContent(structured)
	return &mcp.CallToolResult{
		Content:           content,
		StructuredContent: structured,
		// A program that did not succeed is a tool error the agent should
		// read and react to, not a protocol failure.
		IsError: ex.Status != client.StatusSucceeded,
	}, nil
}

func (t *tools) getUsage(ctx context.Context, req *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
	b, err := t.backendFor(ctx, req)
	if err != nil {
		return errorResult(err.Error()), nil
	}
	u, err := b.Usage(ctx)
	if err != nil {
		return t.apiErrorResult(err), nil
	}
	var structured map[string]any
	if err := json.Unmarshal(u.Raw, &structured); err != nil {
		return nil, fmt.Errorf("decoding usage: %w", err)
	}
	return &mcp.CallToolResult{
		Content:           []mcp.Content{&mcp.TextContent{Text: formatUsage(u, structured)}},
		StructuredContent: structured,
	}, nil
}

// formatExecution renders a result for a model to read; files is the
// line naming the returned files, or "".
func formatExecution(ex *client.Execution, files string) string {
	var b strings.Builder
	fmt.Fprintf(&b, "status: %s\nexit_code: %d\nduration_ms: %d\n", ex.Status, ex.ExitCode, ex.DurationMS)
	if ex.Truncated {
		b.WriteString("truncated: true (output over 64 KB per stream was cut)\n")
	}
	switch ex.Status {
	case client.StatusTimedOut:
		b.WriteString("note: the program was killed when timeout_s ran out\n")
	case client.StatusMemoryExceeded:
		b.WriteString("note: the program was killed for using more memory than the plan allows\n")
	case client.StatusError:
		b.WriteString("note: the sandbox failed, not the program; try again\n")
	}
	// Which build ran it: the packages an agent saw differ across builds.
	if ex.Image != "" {
		fmt.Fprintf(&b, "image: %s", ex.Image)
		if ex.ImageVersion != "" {
			fmt.Fprintf(&b, " (build %s)", ex.ImageVersion)
		}
		b.WriteString("\n")
	}
	fmt.Fprintf(&b, "execution_id: %s\n", ex.ID)
	b.WriteString(files)
	b.WriteString(networkText(ex.Network))
	fmt.Fprintf(&b, "--- stdout ---\n%s", streamText(ex.Stdout))
	fmt.Fprintf(&b, "--- stderr ---\n%s", streamText(ex.Stderr))
	return b.String()
}

// maxNetworkLines bounds the refused or cut attempts the text names; the
// structured content has them all.
const maxNetworkLines = 10

// networkText is what an execution with a network reached, for a model to
// read: its allowlist, traffic, and each refused or cut connection with
// why, so that a fetch that failed says whether the sandbox let it out. ""
// for an execution without a network.
func networkText(n *wire.ExecutionNetwork) string {
	if n == nil {
		return ""
	}
	allow := strings.Join(n.Allow, ", ")
	if allow == "" {
		allow = "(none)"
	}
	var b strings.Builder
	fmt.Fprintf(&b, "network: allowed %s; connections: %d made, %d refused; bytes: %d in, %d out\n",
		allow, n.Connections, n.Refused, n.BytesIn, n.BytesOut)
	// The same refusal repeated (a client retrying) is one line.
	var lines []string
	times := map[string]int{}
	for _, a := range n.Attempts {
		if a.Allowed && a.Reason == "" {
			continue
		}
		line := attemptLine(egress.Attempt(a))
		if times[line] == 0 {
			lines = append(lines, line)
		}
		times[line]++
	}
	for i, line := range lines {
		if i == maxNetworkLines {
			fmt.Fprintf(&b, "(%d more refused or cut connections in the structured content)\n", len(lines)-i)
			break
		}
		b.WriteString(line)
		if k := times[line]; k > 1 {
			fmt.Fprintf(&b, " (%d times)", k)
		}
		b.WriteString("\n")
	}
	return b.String()
}

func streamText(s string) string {
	if s == "" {
		return "(empty)\n"
	}
	if !strings.HasSuffix(s, "\n") {
		s += "\n"
	}
	return s
}

func formatUsage(u *client.Usage, raw map[string]any) string {
	var b strings.Builder
	fmt.Fprintf(&b, "tenant: %s\nplan: %s\ntoday (UTC): %d executions, %.3f sandbox seconds\n",
		u.Tenant, u.Plan, u.Today.Executions, u.Today.SandboxSeconds)
	if limits, ok := raw["limits"].(map[string]any); ok {
		lb, _ := json.Marshal(limits)
		fmt.Fprintf(&b, "limits: %s\n", lb)
	}
	return b.String()
}

// hints tell an agent what to do about an API refusal.
var hints = map[string]string{
	client.CodeQuotaExceeded:  "The daily execution quota of this API key is used up; it resets at 00:00 UTC. Retrying today will fail.",
	client.CodeRateLimited:    "Too many requests this minute; wait before calling again.",
	client.CodeOverloaded:     "Every sandbox is busy right now; try again in a few seconds.",
	client.CodeUnauthorized:   "The API key (KUBO_API_KEY or the Authorization header) is missing, invalid or revoked.",
	client.CodeInvalidTimeout: "timeout_s must be between 1 and the plan's max_timeout_s; call get_usage to see it.",
	"sandbox_not_running":     "The sandbox has ended (killed, expired or failed) and keeps nothing; call create_sandbox for a new one.",
	"sandbox_limit":           "This key has as many sandboxes as its plan allows; kill_sandbox one you no longer need, then try again.",
}

// apiErrorResult turns a refused or failed API call into a tool error the
// agent can read: code, message, request id and what to do. more, when
// set, is a hint of the caller's after the table's.
func (t *tools) apiErrorResult(err error, more ...string) *mcp.CallToolResult {
	var apiErr *client.Error
	if !errors.As(err, &apiErr) {
		if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
			return errorResult("The call was cancelled before the Vertal Run API answered.")
		}
		t.log.Warn("vertal API unreachable", "err", err)
		if t.remote {
			return errorResult("The Vertal Run API is unavailable right now; try again shortly.")
		}
		return errorResult("Could not reach the Vertal Run API (check KUBO_API_URL): " + err.Error())
	}
	var b strings.Builder
	fmt.Fprintf(&b, "Vertal Run API error %s: %s (HTTP %d", apiErr.Code, apiErr.Message, apiErr.StatusCode)
	if apiErr.RequestID != "" {
		fmt.Fprintf(&b, ", request id %s", apiErr.RequestID)
	}
	b.WriteString(").")
	if apiErr.RetryAfter > 0 {
		fmt.Fprintf(&b, " Retry after %s.", apiErr.RetryAfter)
	}
	if h, ok := hints[apiErr.Code]; ok {
		b.WriteString(" " + h)
	}
	for _, h := range more {
		if h != "" {
			b.WriteString(" " + h)
		}
	}
	return errorResult(b.String())
}

// clip shortens client input echoed in a message.
func clip(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "..."
}

func errorResult(msg string) *mcp.CallToolResult {
	return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: msg}}, IsError: true}
}

// fetchImages asks the API which images the key may use; nil (a
// description without images) when it cannot say, e.g. an older server.
func fetchImages(ctx context.Context, c *client.Client) []client.Image {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	images, err := c.Images(ctx)
	if err != nil {
		return nil
	}
	return images
}
