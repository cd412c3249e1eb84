package mcpserver

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/kuboprotocol/vertal2kubo/internal/egress"
	"github.com/kuboprotocol/vertal2kubo/internal/engine"
	"github.com/kuboprotocol/vertal2kubo/internal/sandboxes"
	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// SandboxBackend is a Backend that also serves sandboxes that stay. A
// server lists the sandbox tools only to callers whose Backend is one, so
// a server without sandboxes shows run_code and get_usage alone. Errors
// the API would answer with are *client.Error, as for Backend.
type SandboxBackend interface {
	Backend
	CreateSandbox(ctx context.Context, req sandboxes.CreateRequest) (sandboxes.Sandbox, error)
	RunCommand(ctx context.Context, id string, req sandboxes.CommandRequest) (sandboxes.CommandResult, error)
	// RunCell runs code in a code context of the sandbox (run_code with a
	// sandbox_id).
	RunCell(ctx context.Context, id string, req sandboxes.RunCodeRequest) (sandboxes.CodeResult, error)
	// ReadFile writes the file's content to w.
	ReadFile(ctx context.Context, id, path string, w io.Writer) (int64, error)
	WriteFile(ctx context.Context, id, path string, r io.Reader) (sandboxes.FileInfo, error)
	ListFiles(ctx context.Context, id, path string) ([]sandboxes.FileInfo, error)
	KillSandbox(ctx context.Context, id string) (sandboxes.Sandbox, error)
	PauseSandbox(ctx context.Context, id string) (sandboxes.Sandbox, error)
	ResumeSandbox(ctx context.Context, id string) (sandboxes.Sandbox, error)
}

// Sandbox tool names.
const (
	toolCreateSandbox = "create_sandbox"
	toolRunCommand    = "run_command"
	toolReadFile      = "read_file"
	toolWriteFile     = "write_file"
	toolListFiles     = "list_files"
	toolKillSandbox   = "kill_sandbox"
	toolPauseSandbox  = "pause_sandbox"
	toolResumeSandbox = "resume_sandbox"
)

// readFileCap is how much of a file read_file gives back; an agent's
// context is no place for more.
const readFileCap = 256 << 10

// sandboxNetworkDescription is what create_sandbox's description says of
// its network; run_code's says the same of a run's.
const sandboxNetworkDescription = "\n\nNetwork: the sandbox has none unless the egress allowlist of this API key's plan lists hosts, and the built-in plans list none. Where the plan lists some, the sandbox may reach those for its whole life, and the network argument narrows them for this sandbox ([] for none); asking for a host the plan does not list is refused, with the plan's list in the message. create_sandbox's result shows what the sandbox may reach (limits.network); after run_command, and run_code with its sandbox_id, the result names the connections the sandbox had refused while it ran, each with why (the newest 5)."

const sandboxInstructions = " With create_sandbox you get a sandbox that stays across calls (files, installed state and processes persist until it ends): run shell commands in it with run_command, run Python or JavaScript that keeps its variables from one call to the next with run_code and its sandbox_id, move files with read_file, write_file and list_files, and end it with kill_sandbox when done."

// addSandboxTools adds the sandbox tools to s.
func addSandboxTools(s *mcp.Server, t *tools) {
	for _, tl := range sandboxTools() {
		s.AddTool(tl.tool, tl.handler(t))
	}
}

type sandboxTool struct {
	tool    *mcp.Tool
	handler func(t *tools) mcp.ToolHandler
}

func sandboxIDProp() obj {
	return obj{"type": "string", "description": "The sandbox's id (sbx_...), as create_sandbox returned it."}
}

func pathProp(what string) obj {
	return obj{"type": "string", "description": what + " Relative to the home directory " + engine.HomeDir + ", or absolute."}
}

// sandboxOutput is the structured content of the tools answering with a
// sandbox record.
var sandboxOutput = obj{
	"type": "object",
	"properties": obj{
		"id":            obj{"type": "string", "description": "Sandbox id (sbx_...)."},
		"status":        obj{"type": "string", "enum": []any{"running", "paused", "ended"}},
		"reason":        obj{"type": "string", "description": "Why it ended: killed, expired, error or node_lost."},
		"image":         obj{"type": "string"},
		"image_version": obj{"type": "string"},
		"created_at":    obj{"type": "string"},
		"expires_at":    obj{"type": "string", "description": "When it ends (or pauses, with on_timeout pause) unless killed first."},
		"on_timeout":    obj{"type": "string"},
		"limits": obj{"type": "object", "properties": obj{
			"network": obj{"type": "object",
				"description": "What the sandbox may reach: its allowlist (the plan's, or the narrower one create_sandbox asked for) and the bytes in and out its connections may carry in all. Left out: no network.",
				"properties": obj{
					"allow":     obj{"type": "array", "items": obj{"type": "string"}},
					"max_bytes": obj{"type": "integer", "minimum": 0},
				}},
		}},
		"metadata": obj{"type": []any{"object", "null"}},
		"network": obj{"type": "object",
			"description": "Only for a running sandbox with a network: the bytes its connections carried, the connections made and refused, and the newest attempts, each refused or cut one with its reason.",
			"properties":  networkUsageProps()},
	},
	"required": []any{"id", "status"},
}

func idOnlySchema() obj {
	return obj{
		"type":                 "object",
		"properties":           obj{"sandbox_id": sandboxIDProp()},
		"required":             []any{"sandbox_id"},
		"additionalProperties": false,
	}
}

func sandboxTools() []sandboxTool {
	return []sandboxTool{
		{&mcp.Tool{
			Name:  toolCreateSandbox,
			Title: "Create a sandbox that stays",
			Description: "Create an isolated Vertal Run sandbox that stays across calls, and get its id (sbx_...). Unlike run_code, what you do in it persists: files in its home directory " + engine.HomeDir +
				", and background state, until it ends. Use run_command to run shell commands in it, read_file, write_file and list_files for its files, and kill_sandbox when you are done (it also ends by itself when timeout_s runs out). Its time alive counts toward the plan's usage." + sandboxNetworkDescription,
			Annotations: &mcp.ToolAnnotations{Title: "Create a sandbox that stays", OpenWorldHint: new(false), DestructiveHint: new(false)},
			InputSchema: obj{
				"type": "object",
				"properties": obj{
					"image":     obj{"type": "string", "description": "Image to start, by name. Default: default. Optional."},
					"timeout_s": obj{"type": "integer", "minimum": 1, "description": "Seconds until the sandbox ends by itself (or pauses, with on_timeout pause). Default 300, capped by the plan's lifetime. Optional."},
					"on_timeout": obj{"type": "string", "enum": []any{"kill", "pause"}, "default": "kill",
						"description": "What happens when timeout_s runs out: kill (the default) ends it; pause keeps its files for a later resume_sandbox."},
					"env": obj{"type": "object", "additionalProperties": obj{"type": "string"},
						"description": "Environment variables of every command in the sandbox. Optional."},
					"metadata": obj{"type": "object", "additionalProperties": obj{"type": "string"},
						"description": "Labels kept with the sandbox, for your own bookkeeping. Optional."},
					"files": obj{"type": "array", "description": "Files placed in the home directory before the sandbox starts. Optional.",
						"items": fileItemSchema()},
					"network": networkArgSchema("the sandbox"),
				},
				"additionalProperties": false,
			},
			OutputSchema: sandboxOutput,
		}, func(t *tools) mcp.ToolHandler { return t.createSandbox }},
		{&mcp.Tool{
			Name:  toolRunCommand,
			Title: "Run a command in a sandbox",
			Description: "Run a shell command (by /bin/sh -c) in a sandbox from create_sandbox and wait for it: get back its stdout, stderr, exit code and duration. State carries over between commands: files written, packages the image lets you set up, the working directory's contents. " +
				"The command runs in the home directory " + engine.HomeDir + " unless cwd says otherwise, and is killed when timeout_s runs out. A command that fails or times out comes back as an error result that still carries its output: read stderr and try again.",
			Annotations: &mcp.ToolAnnotations{Title: "Run a command in a sandbox", OpenWorldHint: new(false)},
			InputSchema: obj{
				"type": "object",
				"properties": obj{
					"sandbox_id": sandboxIDProp(),
					"cmd":        obj{"type": "string", "description": "The shell command line, e.g. \"python3 main.py > out.txt && wc -l out.txt\"."},
					"cwd":        pathProp("Working directory. Default: the home directory."),
					"env": obj{"type": "object", "additionalProperties": obj{"type": "string"},
						"description": "Environment variables for this command, over the sandbox's. Optional."},
					"stdin":     obj{"type": "string", "description": "Text given to the command on standard input. Optional."},
					"timeout_s": obj{"type": "integer", "minimum": 1, "description": "Wall-clock limit in seconds: at most the plan's max_timeout_s (see get_usage). Default: 60, or that maximum if lower. Optional."},
				},
				"required":             []any{"sandbox_id", "cmd"},
				"additionalProperties": false,
			},
			OutputSchema: obj{
				"type": "object",
				"properties": obj{
					"pid":         obj{"type": "integer"},
					"status":      obj{"type": "string", "enum": []any{"succeeded", "failed", "timed_out", "memory_exceeded"}, "description": "succeeded means the command exited with code 0."},
					"stdout":      obj{"type": "string"},
					"stderr":      obj{"type": "string"},
					"exit_code":   obj{"type": "integer"},
					"duration_ms": obj{"type": "integer"},
					"truncated":   obj{"type": "boolean", "description": "True if a stream went over the plan's output limit and was cut."},
					"cpu_seconds": obj{"type": "number"},
				},
				"required": []any{"status", "stdout", "stderr", "exit_code", "duration_ms", "truncated"},
			},
		}, func(t *tools) mcp.ToolHandler { return t.runCommand }},
		{&mcp.Tool{
			Name:        toolReadFile,
			Title:       "Read a file of a sandbox",
			Description: fmt.Sprintf("Read a file of a sandbox from create_sandbox. Text comes back as it is; a file that is not UTF-8 text comes back base64-encoded, with a note saying so. Only the first %d KB are returned, with a note when the file is longer.", readFileCap>>10),
			Annotations: &mcp.ToolAnnotations{Title: "Read a file of a sandbox", ReadOnlyHint: true, IdempotentHint: true, OpenWorldHint: new(false)},
			InputSchema: obj{
				"type": "object",
				"properties": obj{
					"sandbox_id": sandboxIDProp(),
					"path":       pathProp("The file to read."),
				},
				"required":             []any{"sandbox_id", "path"},
				"additionalProperties": false,
			},
			OutputSchema: obj{
				"type": "object",
				"properties": obj{
					"path":      obj{"type": "string"},
					"size":      obj{"type": "integer", "description": "The file's whole size in bytes."},
					"encoding":  obj{"type": "string", "enum": []any{"utf8", "base64"}},
					"content":   obj{"type": "string"},
					"truncated": obj{"type": "boolean", "description": "True if only the start of the file is in content."},
				},
				"required": []any{"path", "size", "encoding", "content", "truncated"},
			},
		}, func(t *tools) mcp.ToolHandler { return t.readFile }},
		{&mcp.Tool{
			Name:        toolWriteFile,
			Title:       "Write a file in a sandbox",
			Description: "Write a file in a sandbox from create_sandbox, replacing it if it exists; missing parent directories are created. Content is text, or base64 with encoding base64.",
			Annotations: &mcp.ToolAnnotations{Title: "Write a file in a sandbox", IdempotentHint: true, OpenWorldHint: new(false)},
			InputSchema: obj{
				"type": "object",
				"properties": obj{
					"sandbox_id": sandboxIDProp(),
					"path":       pathProp("The file to write."),
					"content":    contentProp(),
					"encoding":   encodingProp(),
				},
				"required":             []any{"sandbox_id", "path", "content"},
				"additionalProperties": false,
			},
			OutputSchema: fileInfoSchema(),
		}, func(t *tools) mcp.ToolHandler { return t.writeFile }},
		{&mcp.Tool{
			Name:        toolListFiles,
			Title:       "List files of a sandbox",
			Description: "List a directory of a sandbox from create_sandbox: each entry's name, type (file, dir, symlink, other), size, mode and modification time.",
			Annotations: &mcp.ToolAnnotations{Title: "List files of a sandbox", ReadOnlyHint: true, IdempotentHint: true, OpenWorldHint: new(false)},
			InputSchema: obj{
				"type": "object",
				"properties": obj{
					"sandbox_id": sandboxIDProp(),
					"path":       pathProp("The directory to list. Default: the home directory."),
				},
				"required":             []any{"sandbox_id"},
				"additionalProperties": false,
			},
			OutputSchema: obj{
				"type":       "object",
				"properties": obj{"files": obj{"type": "array", "items": fileInfoSchema()}},
				"required":   []any{"files"},
			},
		}, func(t *tools) mcp.ToolHandler { return t.listFiles }},
		{&mcp.Tool{
			Name:         toolKillSandbox,
			Title:        "End a sandbox",
			Description:  "End a sandbox from create_sandbox: its processes stop and its files are deleted. Call it when you are done with the sandbox. Ending an ended sandbox answers its record again.",
			Annotations:  &mcp.ToolAnnotations{Title: "End a sandbox", DestructiveHint: new(true), IdempotentHint: true, OpenWorldHint: new(false)},
			InputSchema:  idOnlySchema(),
			OutputSchema: sandboxOutput,
		}, func(t *tools) mcp.ToolHandler { return t.sandboxCall(SandboxBackend.KillSandbox) }},
		{&mcp.Tool{
			Name:         toolPauseSandbox,
			Title:        "Pause a sandbox",
			Description:  "Pause a sandbox from create_sandbox: its processes stop and its home directory is kept, using no CPU or memory, until resume_sandbox (or any other sandbox tool, which resumes it first).",
			Annotations:  &mcp.ToolAnnotations{Title: "Pause a sandbox", DestructiveHint: new(false), IdempotentHint: true, OpenWorldHint: new(false)},
			InputSchema:  idOnlySchema(),
			OutputSchema: sandboxOutput,
		}, func(t *tools) mcp.ToolHandler { return t.sandboxCall(SandboxBackend.PauseSandbox) }},
		{&mcp.Tool{
			Name:         toolResumeSandbox,
			Title:        "Resume a sandbox",
			Description:  "Resume a paused sandbox with its home directory as it was when paused.",
			Annotations:  &mcp.ToolAnnotations{Title: "Resume a sandbox", DestructiveHint: new(false), IdempotentHint: true, OpenWorldHint: new(false)},
			InputSchema:  idOnlySchema(),
			OutputSchema: sandboxOutput,
		}, func(t *tools) mcp.ToolHandler { return t.sandboxCall(SandboxBackend.ResumeSandbox) }},
	}
}

func fileInfoSchema() obj {
	return obj{
		"type": "object",
		"properties": obj{
			"name":  obj{"type": "string"},
			"path":  obj{"type": "string"},
			"type":  obj{"type": "string", "enum": []any{"file", "dir", "symlink", "other"}},
			"size":  obj{"type": "integer"},
			"mode":  obj{"type": "string", "description": "Octal permission bits, e.g. 0644."},
			"mtime": obj{"type": "string"},
		},
		"required": []any{"name", "path", "type", "size"},
	}
}

// decodeArgs decodes a tool's arguments into dst (decodeStrict),
// and checks that the named string fields are not empty.
func decodeArgs(raw json.RawMessage, dst any, required map[string]*string) error {
	if err := decodeStrict(raw, dst); err != nil {
		return fmt.Errorf("invalid arguments: %v", err)
	}
	for _, name := range []string{"sandbox_id", "cmd", "path", "content"} {
		if v, ok := required[name]; ok && *v == "" {
			return fmt.Errorf("argument %s is required and must not be empty", name)
		}
	}
	return nil
}

// sandboxBackend is the SandboxBackend of a tool call, or the tool error
// to answer when there is none.
func (t *tools) sandboxBackend(ctx context.Context, req *mcp.CallToolRequest) (SandboxBackend, *mcp.CallToolResult) {
	b, err := t.backendFor(ctx, req)
	if err != nil {
		return nil, errorResult(err.Error())
	}
	sb, ok := b.(SandboxBackend)
	if !ok {
		return nil, errorResult("This server does not offer sandboxes that stay; use run_code.")
	}
	return sb, nil
}

// decodeContent is content in encoding (utf8 or base64), or an error
// naming the argument.
func decodeContent(content, encoding, arg string) ([]byte, error) {
	switch encoding {
	case "", "utf8":
		return []byte(content), nil
	case "base64":
		b, err := base64.StdEncoding.Strict().DecodeString(content)
		if err != nil {
			return nil, fmt.Errorf("argument %s is not valid base64", arg)
		}
		return b, nil
	}
	return nil, fmt.Errorf("argument %s encoding must be utf8 or base64, not %q", arg, clip(encoding, 20))
}

type createArgs struct {
	Image     string            `json:"image"`
	TimeoutS  *int              `json:"timeout_s"`
	OnTimeout string            `json:"on_timeout"`
	Env       map[string]string `json:"env"`
	Metadata  map[string]string `json:"metadata"`
	Files     []fileArg         `json:"files"`
	Network   networkArg        `json:"network"`
}

func (t *tools) createSandbox(ctx context.Context, req *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
	var a createArgs
	if err := decodeArgs(req.Params.Arguments, &a, nil); err != nil {
		return errorResult(err.Error()), nil
	}
	r := sandboxes.CreateRequest{Image: a.Image, Env: a.Env, Metadata: a.Metadata, OnTimeout: a.OnTimeout, Network: a.Network.request()}
	switch {
	case a.TimeoutS != nil && *a.TimeoutS < 1:
		return errorResult("argument timeout_s must be at least 1"), nil
	case a.OnTimeout != "" && a.OnTimeout != "kill" && a.OnTimeout != "pause":
		return errorResult(fmt.Sprintf("argument on_timeout must be kill or pause, not %q", clip(a.OnTimeout, 20))), nil
	}
	if a.TimeoutS != nil {
		r.TimeoutS = *a.TimeoutS
	}
	for i, f := range a.Files {
		if f.Path == "" {
			return errorResult(fmt.Sprintf("argument files[%d].path is required", i)), nil
		}
		content, err := decodeContent(f.Content, f.Encoding, fmt.Sprintf("files[%d].content", i))
		if err != nil {
			return errorResult(err.Error()), nil
		}
		r.Files = append(r.Files, sandboxes.File{Path: f.Path, Content: content})
	}
	b, res := t.sandboxBackend(ctx, req)
	if res != nil {
		return res, nil
	}
	sb, err := b.CreateSandbox(ctx, r)
	if err != nil {
		return t.apiErrorResult(err, a.Network.hint(err)), nil
	}
	return sandboxResult(sb, "created")
}

// sandboxCall is the handler of a tool taking only sandbox_id and
// answering with the sandbox's record.
func (t *tools) sandboxCall(call func(SandboxBackend, context.Context, string) (sandboxes.Sandbox, error)) mcp.ToolHandler {
	return func(ctx context.Context, req *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
		var a struct {
			SandboxID string `json:"sandbox_id"`
		}
		if err := decodeArgs(req.Params.Arguments, &a, map[string]*string{"sandbox_id": &a.SandboxID}); err != nil {
			return errorResult(err.Error()), nil
		}
		b, res := t.sandboxBackend(ctx, req)
		if res != nil {
			return res, nil
		}
		sb, err := call(b, ctx, a.SandboxID)
		if err != nil {
			return t.apiErrorResult(err), nil
		}
		return sandboxResult(sb, "")
	}
}

// sandboxResult renders a sandbox's record; verb, when set, says what
// just happened to it.
func sandboxResult(sb sandboxes.Sandbox, verb string) (*mcp.CallToolResult, error) {
	if u := sb.Network; u != nil && u.Attempts == nil {
		// The output schema's attempts is an array, as on the API's wire.
		nu := *u
		nu.Attempts = []egress.Attempt{}
		sb.Network = &nu
	}
	structured, err := structure(sb)
	if err != nil {
		return nil, err
	}
	var b strings.Builder
	fmt.Fprintf(&b, "sandbox_id: %s\nstatus: %s\n", sb.ID, sb.Status)
	if sb.Reason != "" {
		fmt.Fprintf(&b, "reason: %s\n", sb.Reason)
	}
	if sb.Message != "" {
		fmt.Fprintf(&b, "message: %s\n", sb.Message)
	}
	if sb.Image != "" {
		fmt.Fprintf(&b, "image: %s", sb.Image)
		if sb.ImageVersion != "" {
			fmt.Fprintf(&b, " (build %s)", sb.ImageVersion)
		}
		b.WriteString("\n")
	}
	if sb.Status != sandboxes.StatusEnded && !sb.ExpiresAt.IsZero() {
		fmt.Fprintf(&b, "expires_at: %s (on_timeout %s)\n", sb.ExpiresAt.UTC().Format(time.RFC3339), sb.OnTimeout)
	}
	if sb.Status != sandboxes.StatusEnded {
		b.WriteString(sandboxNetworkText(sb, verb == "created"))
	}
	if verb == "created" {
		fmt.Fprintf(&b, "home: %s\nnote: pass sandbox_id to run_command, read_file, write_file and list_files; call kill_sandbox when done\n", engine.HomeDir)
	}
	return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: b.String()}}, StructuredContent: structured}, nil
}

// sandboxNetworkText is the line of a sandbox's record saying what it may
// reach and, while it runs, what it reached; "" for a sandbox without a
// network unless created, where "network: none" says so.
func sandboxNetworkText(sb sandboxes.Sandbox, created bool) string {
	n := sb.Limits.Network
	if n == nil || len(n.Allow) == 0 {
		if created {
			return "network: none\n"
		}
		return ""
	}
	var b strings.Builder
	fmt.Fprintf(&b, "network: allowed %s", strings.Join(n.Allow, ", "))
	if n.MaxBytes > 0 {
		fmt.Fprintf(&b, " (at most %d bytes in all)", n.MaxBytes)
	}
	if u := sb.Network; u != nil {
		fmt.Fprintf(&b, "; connections: %d made, %d refused; bytes: %d in, %d out", u.Connections, u.Refused, u.BytesIn, u.BytesOut)
	}
	b.WriteString("\n")
	return b.String()
}

// structure is v as the JSON object a tool's structured content is.
func structure(v any) (map[string]any, error) {
	raw, err := json.Marshal(v)
	if err != nil {
		return nil, err
	}
	var out map[string]any
	if err := json.Unmarshal(raw, &out); err != nil {
		return nil, err
	}
	return out, nil
}

type commandArgs struct {
	SandboxID string            `json:"sandbox_id"`
	Cmd       string            `json:"cmd"`
	Cwd       string            `json:"cwd"`
	Env       map[string]string `json:"env"`
	Stdin     string            `json:"stdin"`
	TimeoutS  *int              `json:"timeout_s"`
}

func (t *tools) runCommand(ctx context.Context, req *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
	var a commandArgs
	if err := decodeArgs(req.Params.Arguments, &a, map[string]*string{"sandbox_id": &a.SandboxID, "cmd": &a.Cmd}); err != nil {
		return errorResult(err.Error()), nil
	}
	r := sandboxes.CommandRequest{Cmd: a.Cmd, Cwd: a.Cwd, Env: a.Env, Stdin: a.Stdin}
	if a.TimeoutS != nil {
		if *a.TimeoutS < 1 {
			return errorResult("argument timeout_s must be at least 1"), nil
		}
		r.TimeoutS = *a.TimeoutS
	}
	b, res := t.sandboxBackend(ctx, req)
	if res != nil {
		return res, nil
	}
	watch := watchRefused(ctx, b, a.SandboxID)
	out, err := b.RunCommand(ctx, a.SandboxID, r)
	if err != nil {
		return t.apiErrorResult(err), nil
	}
	structured, err := structure(out)
	if err != nil {
		return nil, err
	}
	var text strings.Builder
	fmt.Fprintf(&text, "status: %s\nexit_code: %d\nduration_ms: %d\n", out.Status, out.ExitCode, out.DurationMS)
	if out.Truncated {
		text.WriteString("truncated: true (output over the plan's limit per stream was cut)\n")
	}
	switch out.Status {
	case "timed_out":
		text.WriteString("note: the command was killed when timeout_s ran out; the sandbox is still there\n")
	case "memory_exceeded":
		text.WriteString("note: the command was killed for using more memory than the plan allows\n")
	}
	fmt.Fprintf(&text, "sandbox_id: %s\n", a.SandboxID)
	text.WriteString(watch.text(ctx))
	fmt.Fprintf(&text, "--- stdout ---\n%s", streamText(out.Stdout))
	fmt.Fprintf(&text, "--- stderr ---\n%s", streamText(out.Stderr))
	return &mcp.CallToolResult{
		Content:           []mcp.Content{&mcp.TextContent{Text: text.String()}},
		StructuredContent: structured,
		IsError:           out.Status != "succeeded",
	}, nil
}

type pathArgs struct {
	SandboxID string `json:"sandbox_id"`
	Path      string `json:"path"`
}

// capWriter keeps the first n bytes written to it and counts the rest.
type capWriter struct {
	buf   bytes.Buffer
	n     int
	total int64
}

func (w *capWriter) Write(p []byte) (int, error) {
	w.total += int64(len(p))
	if room := w.n - w.buf.Len(); room > 0 {
		w.buf.Write(p[:min(room, len(p))])
	}
	return len(p), nil
}

func (t *tools) readFile(ctx context.Context, req *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
	var a pathArgs
	if err := decodeArgs(req.Params.Arguments, &a, map[string]*string{"sandbox_id": &a.SandboxID, "path": &a.Path}); err != nil {
		return errorResult(err.Error()), nil
	}
	b, res := t.sandboxBackend(ctx, req)
	if res != nil {
		return res, nil
	}
	w := &capWriter{n: readFileCap}
	if _, err := b.ReadFile(ctx, a.SandboxID, a.Path, w); err != nil {
		return t.apiErrorResult(err), nil
	}
	data := w.buf.Bytes()
	truncated := w.total > int64(len(data))
	encoding, content := "utf8", string(data)
	if !utf8.Valid(data) {
		// A cut may have split the last character only.
		if trimmed := trimPartialRune(data); truncated && utf8.Valid(trimmed) {
			content = string(trimmed)
		} else {
			encoding, content = "base64", base64.StdEncoding.EncodeToString(data)
		}
	}
	var notes []string
	if encoding == "base64" {
		notes = append(notes, "note: the file is not UTF-8 text; its content above is base64-encoded")
	}
	if truncated {
		notes = append(notes, fmt.Sprintf("note: the file has %d bytes; only the first %d are shown (read the rest with run_command, e.g. tail or sed)", w.total, len(data)))
	}
	out := []mcp.Content{&mcp.TextContent{Text: content}}
	if len(notes) > 0 {
		out = append(out, &mcp.TextContent{Text: strings.Join(notes, "\n")})
	}
	return &mcp.CallToolResult{
		Content: out,
		StructuredContent: map[string]any{"path": a.Path, "size": w.total, "encoding": encoding,
			"content": content, "truncated": truncated},
	}, nil
}

// trimPartialRune is b without an incomplete UTF-8 sequence at its end.
func trimPartialRune(b []byte) []byte {
	for i := 1; i < utf8.UTFMax && i <= len(b); i++ {
		if utf8.RuneStart(b[len(b)-i]) {
			if !utf8.FullRune(b[len(b)-i:]) {
				return b[:len(b)-i]
			}
			break
		}
	}
	return b
}

type writeArgs struct {
	SandboxID string  `json:"sandbox_id"`
	Path      string  `json:"path"`
	Content   *string `json:"content"`
	Encoding  string  `json:"encoding"`
}

func (t *tools) writeFile(ctx context.Context, req *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
	var a writeArgs
	if err := decodeArgs(req.Params.Arguments, &a, map[string]*string{"sandbox_id": &a.SandboxID, "path": &a.Path}); err != nil {
		return errorResult(err.Error()), nil
	}
	if a.Content == nil {
		// An empty file is fine; a forgotten content is not.
		return errorResult("argument content is required (\"\" for an empty file)"), nil
	}
	data, err := decodeContent(*a.Content, a.Encoding, "content")
	if err != nil {
		return errorResult(err.Error()), nil
	}
	b, res := t.sandboxBackend(ctx, req)
	if res != nil {
		return res, nil
	}
	fi, err := b.WriteFile(ctx, a.SandboxID, a.Path, bytes.NewReader(data))
	if err != nil {
		return t.apiErrorResult(err), nil
	}
	structured, err := structure(fi)
	if err != nil {
		return nil, err
	}
	return &mcp.CallToolResult{
		Content:           []mcp.Content{&mcp.TextContent{Text: fmt.Sprintf("wrote %s (%d bytes, mode %s)\n", fi.Path, fi.Size, fi.Mode)}},
		StructuredContent: structured,
	}, nil
}

func (t *tools) listFiles(ctx context.Context, req *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
	var a pathArgs
	if err := decodeArgs(req.Params.Arguments, &a, map[string]*string{"sandbox_id": &a.SandboxID}); err != nil {
		return errorResult(err.Error()), nil
	}
	path := a.Path
	if path == "" {
		path = engine.HomeDir
	}
	b, res := t.sandboxBackend(ctx, req)
	if res != nil {
		return res, nil
	}
	files, err := b.ListFiles(ctx, a.SandboxID, path)
	if err != nil {
		return t.apiErrorResult(err), nil
	}
	if files == nil {
		files = []sandboxes.FileInfo{}
	}
	var text strings.Builder
	fmt.Fprintf(&text, "%s: %d entries\n", path, len(files))
	for _, f := range files {
		name := f.Name
		if f.Type == "dir" {
			name += "/"
		}
		fmt.Fprintf(&text, "%-7s %s %10d %s %s\n", f.Type, f.Mode, f.Size, f.ModTime.UTC().Format(time.RFC3339), name)
	}
	structured, err := structure(struct {
		Files []sandboxes.FileInfo `json:"files"`
	}{files})
	if err != nil {
		return nil, err
	}
	return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: text.String()}}, StructuredContent: structured}, nil
}
