package mcpserver

import (
	"context"
	"encoding/base64"
	"fmt"
	"net/url"
	"strings"

	"github.com/kuboprotocol/vertal2kubo/internal/sandboxes"
	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// runCell is run_code with a sandbox_id: the code runs as a cell in a code
// context of that sandbox, which keeps its state between calls. Results
// come back as content: the text an agent reads, each image as image
// content, and HTML (a DataFrame) as an embedded resource.
func (t *tools) runCell(ctx context.Context, b Backend, a runArgs) (*mcp.CallToolResult, error) {
	switch {
	case a.SandboxID == "":
		return errorResult("argument context_id needs sandbox_id, the sandbox the context is in"), nil
	case a.Image != "" || a.Stdin != "" || len(a.Files) > 0 || len(a.Args) > 0 || len(a.ReturnFiles) > 0 || a.Network != nil:
		return errorResult("with sandbox_id, the arguments image, stdin, files, args, return_files and network do not apply: the sandbox keeps its own files (use write_file and read_file) and its own network"), nil
	}
	sb, ok := b.(SandboxBackend)
	if !ok {
		return errorResult("This server does not offer sandboxes that stay; use run_code without sandbox_id."), nil
	}
	r := sandboxes.RunCodeRequest{Code: a.Code, ContextID: a.ContextID, Language: a.Language, Env: a.Env}
	if a.TimeoutS != nil {
		r.TimeoutS = int(*a.TimeoutS)
	}
	watch := watchRefused(ctx, sb, a.SandboxID)
	out, err := sb.RunCell(ctx, a.SandboxID, r)
	if err != nil {
		return t.apiErrorResult(err), nil
	}
	var text strings.Builder
	fmt.Fprintf(&text, "status: %s\nsandbox_id: %s\ncontext_id: %s\nexecution_count: %d\nduration_ms: %d\n",
		out.Status, a.SandboxID, out.ContextID, out.ExecutionCount, out.DurationMS)
	if out.Truncated {
		text.WriteString("truncated: true (output over the plan's limit, or results over 16 MiB, were cut)\n")
	}
	if out.Status == "timed_out" {
		text.WriteString("note: the cell was interrupted when timeout_s ran out\n")
	}
	text.WriteString(watch.text(ctx))
	fmt.Fprintf(&text, "--- stdout ---\n%s", streamText(out.Stdout))
	fmt.Fprintf(&text, "--- stderr ---\n%s", streamText(out.Stderr))
	content := []mcp.Content{nil}
	results := make([]map[string]string, 0, len(out.Results))
	for i, o := range out.Results {
		kept := map[string]string{}
		for mime, v := range o.Data {
			if !strings.HasPrefix(mime, "image/") || mime == "image/svg+xml" {
				kept[mime] = v
			}
		}
		results = append(results, kept)
		if o.Main {
			fmt.Fprintf(&text, "--- result ---\n%s\n", o.Data["text/plain"])
		}
		if png, err := base64.StdEncoding.DecodeString(o.Data["image/png"]); err == nil && len(png) > 0 {
			content = append(content, &mcp.ImageContent{Data: png, MIMEType: "image/png"})
			if !o.Main {
				fmt.Fprintf(&text, "--- figure %d: image below ---\n", i+1)
			}
		}
		if html := o.Data["text/html"]; html != "" {
			content = append(content, &mcp.EmbeddedResource{Resource: &mcp.ResourceContents{
				URI:      "vertal://sandboxes/" + url.PathEscape(a.SandboxID) + "/contexts/" + url.PathEscape(out.ContextID) + fmt.Sprintf("/results/%d.html", i+1),
				MIMEType: "text/html", Text: html}})
		}
	}
	var cellErr any
	if e := out.Error; e != nil {
		fmt.Fprintf(&text, "--- error: %s ---\n%s\n", e.Name, strings.TrimRight(e.Traceback, "\n"))
		switch e.Name {
		case "ContextRestarted", "ContextDied":
			text.WriteString("note: the interpreter was restarted and its state is lost: define again what later cells need\n")
		}
		cellErr = map[string]string{"name": e.Name, "value": e.Value, "traceback": e.Traceback}
	}
	content[0] = &mcp.TextContent{Text: text.String()}
	exit := 0
	if out.Status != "succeeded" {
		exit = 1
	}
	return &mcp.CallToolResult{
		Content: content,
		StructuredContent: map[string]any{
			"id": out.ContextID, "status": out.Status, "stdout": out.Stdout, "stderr": out.Stderr, "exit_code": exit,
			"duration_ms": out.DurationMS, "truncated": out.Truncated, "sandbox_id": a.SandboxID, "context_id": out.ContextID,
			"execution_count": out.ExecutionCount, "results": results, "error": cellErr,
		},
		IsError: out.Status != "succeeded",
	}, nil
}
