package mcpserver

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"

	"github.com/kuboprotocol/vertal2kubo/client"
	"github.com/kuboprotocol/vertal2kubo/internal/egress"
	"github.com/kuboprotocol/vertal2kubo/internal/execution"
	"github.com/kuboprotocol/vertal2kubo/internal/lang"
	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// Tool names. The Python server (sdk/python/vertal2kubo/mcp.py) offers the
// same tools with the same schemas; testdata/tools.golden.json is checked by
// both test suites.
const (
	toolRunCode  = "run_code"
	toolGetUsage = "get_usage"
)

// defaultLanguages is used in descriptions when the server's list is not
// known (the API could not be reached at start).
var defaultLanguages = func() []client.Language {
	out := make([]client.Language, len(lang.All))
	for i, d := range lang.All {
		out[i] = client.Language{Name: d.Name}
	}
	return out
}()

// languageLabel names a language as an agent would search for it.
func languageLabel(l client.Language) string {
	label := l.Name
	if d, ok := lang.Get(l.Name); ok && d.Runtime != "" {
		label += " (" + d.Runtime
		if l.Version != "" {
			label += " " + l.Version
		}
		return label + ")"
	}
	if l.Version != "" {
		label += " " + l.Version
	}
	return label
}

// imagesParagraph lists the images an agent may choose and what each
// adds, so it knows what it can import; "" when only the default image
// (standard libraries) is known.
func imagesParagraph(images []client.Image) string {
	if len(images) == 0 || len(images) == 1 && len(images[0].Packages) == 0 {
		return ""
	}
	parts := make([]string, len(images))
	for i, img := range images {
		if len(img.Packages) == 0 {
			parts[i] = img.Name + " (standard libraries only)"
			continue
		}
		pkgs := make([]string, len(img.Packages))
		for j, p := range img.Packages {
			pkgs[j] = strings.TrimSpace(p.Name + " " + p.Version)
		}
		parts[i] = img.Name + " (" + strings.Join(pkgs, ", ") + ")"
	}
	return "\n\nImages, chosen with the image argument (default: default): " + strings.Join(parts, "; ") +
		". Debian (apt) packages are Python modules: python3-pandas is import pandas; npm packages load with require()."
}

// runCodeDescription tells an agent what the sandbox can and cannot do.
// Keep it in step with describe_run_code in the Python server.
func runCodeDescription(langs []client.Language, images []client.Image) string {
	if len(langs) == 0 {
		langs = defaultLanguages
	}
	labels := make([]string, len(langs))
	for i, l := range langs {
		labels[i] = languageLabel(l)
	}
	return fmt.Sprintf(`Run a complete program in a fresh, isolated Vertal Run sandbox and get back its stdout, stderr, exit code and duration.

Languages: %s. Only each language's standard library is available, unless the image adds packages.%s

What the sandbox cannot do: it has no network access (no HTTP requests, no downloads) beyond the hosts its plan allows (see Network), packages cannot be installed (pip, npm and apt do not work; the root filesystem is read-only), and nothing persists between calls, so every call must contain the whole program, including imports and data.

What it can do: read standard input (the stdin argument), write files in its working directory /code and under /tmp (each its own space of at least 16 MB, 1 MB per file; nothing written can be executed), and use 1 CPU and up to 64 processes or threads. Memory is capped per plan (memory_mb in get_usage).

Files, environment and arguments: the program runs in the working directory /code. Give it input files with files (paths relative to /code, content as text or base64), environment variables with env and command-line arguments with args (sys.argv[1:], process.argv.slice(2), $1...). To get back files the program writes in /code, list globs in return_files ("*.png", "out/**"): images come back as image content, any other file as an embedded resource. The number and total size of files in and out are capped per plan.

Network: the program may reach only the hosts on the egress allowlist of this API key's plan, and the built-in plans list none. Where the plan lists some, the network argument narrows them for one call ([] for none); asking for a host the plan does not list is refused, with the plan's list in the message. A run with a network reports the bytes it carried and each connection refused, with why, so a failed fetch says whether the sandbox let it out.

Limits: the program is killed when timeout_s runs out (10 seconds unless you ask for more, up to the plan's max_timeout_s shown by get_usage). Output is kept up to 64 KB per stream; beyond that it is cut and truncated is true, so print summaries rather than huge data.

A program that fails, times out or runs out of memory comes back as an error result that still carries its status, output and exit code: read stderr, fix the code and call again. Every call counts once toward the daily quota.`, strings.Join(labels, ", "), imagesParagraph(images))
}

const getUsageDescription = `Show today's usage of this Vertal Run API key (executions and sandbox seconds in the current UTC day) and the plan's limits: executions per day, requests per minute and the maximum timeout_s for run_code. Use it to choose timeout_s, or after run_code reports quota_exceeded or rate_limited. It does not run code and does not count toward the quota.`

// obj is a JSON object; schemas are plain JSON so the Python server can
// hold the very same documents.
type obj = map[string]any

func runCodeTool(langs []client.Language, images []client.Image, withSandboxes bool) *mcp.Tool {
	if len(langs) == 0 {
		langs = defaultLanguages
	}
	names := make([]string, len(langs))
	for i, l := range langs {
		names[i] = l.Name
	}
	tool := &mcp.Tool{
		Name:        toolRunCode,
		Title:       "Run code in a sandbox",
		Description: runCodeDescription(langs, images),
		Annotations: &mcp.ToolAnnotations{
			Title: "Run code in a sandbox",
			// The sandbox cannot reach anything outside itself and
			// changes nothing that outlives the call.
			OpenWorldHint:   new(false),
			DestructiveHint: new(false),
		},
		InputSchema: obj{
			"type": "object",
			"properties": obj{
				"image":    obj{"type": "string", "description": "Image to run on, by name. Default: default. Other images add packages, listed in this description when the server has any. Optional."},
				"language": obj{"type": "string", "description": "Programming language: " + strings.Join(names, ", ") + "."},
				"code":     obj{"type": "string", "description": "The complete program to run. Print what you want to see to stdout."},
				"timeout_s": obj{"type": "number", "minimum": 1,
					"description": "Wall-clock limit in seconds, from 1 to the plan's max_timeout_s (see get_usage). Default 10, or the plan's maximum if lower."},
				"stdin": obj{"type": "string", "description": "Text given to the program on standard input. Optional."},
				"files": obj{"type": "array", "description": "Files placed in the working directory (/code) before the program runs. Optional.",
					"items": fileItemSchema()},
				"env": obj{"type": "object", "additionalProperties": obj{"type": "string"},
					"description": "Environment variables for the program. Names match [A-Za-z_][A-Za-z0-9_]*; PATH, HOME, LANG, PWD, NODE_OPTIONS and VERTAL_* cannot be set. Optional."},
				"args": obj{"type": "array", "items": obj{"type": "string"},
					"description": "Command-line arguments after the program file (sys.argv[1:], process.argv.slice(2), $1...). Optional."},
				"return_files": obj{"type": "array", "items": obj{"type": "string"}, "maxItems": 20,
					"description": "Globs relative to /code of files to send back after the run, e.g. [\"*.png\", \"out/**\"]. Images come back as image content, other files as embedded resources. Optional."},
				"network": networkArgSchema("the program"),
			},
			"required":             []any{"language", "code"},
			"additionalProperties": false,
		},
		OutputSchema: obj{
			"type": "object",
			"properties": obj{
				"id": obj{"type": "string", "description": "Execution id (exe_...)."},
				"status": obj{"type": "string", "enum": []any{"succeeded", "failed", "timed_out", "memory_exceeded", "error", "canceled"},
					"description": "succeeded means the program exited with code 0."},
				"stdout":      obj{"type": "string"},
				"stderr":      obj{"type": "string"},
				"exit_code":   obj{"type": "integer"},
				"duration_ms": obj{"type": "integer"},
				"truncated":   obj{"type": "boolean", "description": "True if a stream went over 64 KB and was cut."},
				"usage": obj{"type": "object", "properties": obj{
					"sandbox_seconds":   obj{"type": "number"},
					"network_bytes_in":  obj{"type": "integer", "description": "Only with a network: bytes carried to the sandbox."},
					"network_bytes_out": obj{"type": "integer", "description": "Only with a network: bytes carried from the sandbox."},
				}},
				"request_id": obj{"type": "string"},
				"image":      obj{"type": []any{"string", "null"}, "description": "The image the code ran on (default when none was named)."},
				"image_version": obj{"type": []any{"string", "null"},
					"description": "The id of that image's build (GET /v1/images shows it as version); null when unknown. Two runs with the same id had the same packages."},
				"files": obj{"type": "array", "description": "Files matched by return_files (their content is in the result's content).",
					"items": obj{"type": "object", "properties": obj{
						"path": obj{"type": "string"},
						"size": obj{"type": "integer"},
					}}},
				"files_truncated": obj{"type": "boolean", "description": "True if the plan's caps left some matching files out."},
				"network":         networkSchema(),
			},
			"required": []any{"id", "status", "stdout", "stderr", "exit_code", "duration_ms", "truncated"},
		},
	}
	if withSandboxes {
		withCells(tool)
	}
	return tool
}

// cellDescription is what run_code's description adds when the server
// has sandboxes that stay: cells with state.
const cellDescription = `

Keeping state between calls: pass sandbox_id (from create_sandbox) and the code runs as a cell in an interpreter that stays in that sandbox, Python or JavaScript (language), instead of a fresh program. Variables, imports, loaded data and open files are kept from one call to the next, so send only the new step (load a CSV once, then inspect it, then plot it). The value of the cell's last expression comes back as its result (a pandas DataFrame also as an HTML table, where the image has pandas), and every matplotlib figure left open comes back as an image. A cell that times out is interrupted (KeyboardInterrupt) and the state stays. Each language has one default interpreter per sandbox; context_id picks another one made over the API. With sandbox_id, files, stdin, args, return_files, image and network do not apply: the sandbox's own files stay in its home directory (use write_file and read_file).`

// withCells extends run_code's schemas with sandbox_id and context_id.
func withCells(tool *mcp.Tool) {
	tool.Description += cellDescription
	in := tool.InputSchema.(obj)["properties"].(obj)
	in["sandbox_id"] = obj{"type": "string", "description": "A sandbox from create_sandbox (sbx_...): run the code as a cell that keeps state between calls. Optional."}
	in["context_id"] = obj{"type": "string", "description": "With sandbox_id: the code context (ctx_...) to run in. Default: the language's default context. Optional."}
	out := tool.OutputSchema.(obj)["properties"].(obj)
	out["id"] = obj{"type": "string", "description": "Execution id (exe_...); for a cell, its code context's id (ctx_...)."}
	out["sandbox_id"] = obj{"type": "string", "description": "For a cell: its sandbox."}
	out["context_id"] = obj{"type": "string", "description": "For a cell: the code context that ran it; pass it back to keep using it."}
	out["execution_count"] = obj{"type": "integer", "description": "For a cell: its number in its context."}
	out["results"] = obj{"type": "array", "description": "For a cell: its results, MIME bundles without their images (those are in the content).",
		"items": obj{"type": "object"}}
	out["error"] = obj{"type": []any{"object", "null"}, "description": "For a cell: what it raised (name, value, traceback)."}
}

func getUsageTool() *mcp.Tool {
	return &mcp.Tool{
		Name:        toolGetUsage,
		Title:       "Usage and plan limits",
		Description: getUsageDescription,
		Annotations: &mcp.ToolAnnotations{
			Title:          "Usage and plan limits",
			ReadOnlyHint:   true,
			IdempotentHint: true,
			OpenWorldHint:  new(false),
		},
		InputSchema: obj{"type": "object", "properties": obj{}, "additionalProperties": false},
		OutputSchema: obj{
			"type": "object",
			"properties": obj{
				"tenant": obj{"type": "string"},
				"plan":   obj{"type": "string"},
				"today": obj{"type": "object", "properties": obj{
					"executions":      obj{"type": "integer"},
					"sandbox_seconds": obj{"type": "number"},
				}},
				"limits": obj{"type": "object", "properties": obj{
					"executions_per_day":  obj{"type": "integer"},
					"requests_per_minute": obj{"type": "integer"},
					"max_timeout_s":       obj{"type": "integer"},
					"memory_mb":           obj{"type": "integer"},
				}},
			},
			"required": []any{"tenant", "plan", "today", "limits"},
		},
	}
}

// networkArgSchema is the network argument of run_code and of
// create_sandbox: what who (the program, the sandbox) may reach. Both
// decode it into a networkArg.
func networkArgSchema(who string) obj {
	return obj{"type": "array", "items": obj{"type": "string"}, "maxItems": egress.MaxRules,
		"description": "What " + who + " may reach, within the plan's egress allowlist: host names (pypi.org), *.suffix wildcards (*.pythonhosted.org) and address ranges (203.0.113.0/24). Left out: the plan's whole list (none on the built-in plans); []: no network. " + networkProxyNote + " Optional."}
}

// networkProxyNote says what kind of network a sandbox gets: the egress
// proxy's (egress.Options: HTTP and CONNECT, on the default ports 80 and
// 443, which no server option changes).
const networkProxyNote = "The network is HTTP and HTTPS only, through a proxy that HTTP_PROXY and HTTPS_PROXY name (ports 80 and 443), so ssh, git:// and other raw connections do not get out."

// networkArg is a decoded network argument (networkArgSchema): nil when
// left out or null, which takes the plan's allowlist; [] decodes to an
// empty, non-nil slice, which asks for no network. The rules themselves
// are the service's to check, with the API's messages.
type networkArg []string

// networkListMessage is the refusal of a network argument that is not a
// list; the Python server says the same.
const networkListMessage = "network must be a list of rules (strings such as \"pypi.org\"), [] for no network, or left out for the plan's whole list"

// UnmarshalJSON refuses a network that is not a list of strings in the
// argument's own words, not in Go's types.
func (a *networkArg) UnmarshalJSON(b []byte) error {
	if isNull(b) {
		*a = nil
		return nil
	}
	var elems []json.RawMessage
	if err := json.Unmarshal(b, &elems); err != nil {
		return errors.New(networkListMessage)
	}
	rules := make([]string, len(elems))
	for i, e := range elems {
		// null is no rule; encoding/json would make it "".
		if isNull(e) || json.Unmarshal(e, &rules[i]) != nil {
			return fmt.Errorf("network[%d] must be a string", i)
		}
	}
	*a = rules
	return nil
}

// request is a as the services take it, as the API's "network" would be.
func (a networkArg) request() *execution.NetworkRequest {
	if a == nil {
		return nil
	}
	return &execution.NetworkRequest{Allow: a}
}

// hint is what to do about err, the API's refusal of a call that asked
// for network a; "" when the call asked for none or err is not about it.
// The API's message names its field (network.allow) and the plan's list.
func (a networkArg) hint(err error) string {
	var apiErr *client.Error
	// Only a 403 says the list is wider than the plan; a 400 is a
	// malformed rule, which the plan's list does not explain.
	if a == nil || !errors.As(err, &apiErr) || apiErr.StatusCode != http.StatusForbidden ||
		!strings.HasPrefix(apiErr.Message, "network") && !strings.Contains(apiErr.Message, "allows no network") {
		return ""
	}
	return "The network argument may list only what the plan's egress allowlist covers; leave network out for the plan's whole list, or pass [] for none."
}

// networkSchema is run_code's network in its output: what a run with a
// network reached (wire.ExecutionNetwork).
func networkSchema() obj {
	props := networkUsageProps()
	props["allow"] = obj{"type": "array", "items": obj{"type": "string"}}
	return obj{"type": "object",
		"description": "Only for a run with a network: its allowlist, the bytes its connections carried, the connections made and refused, and the newest attempts, each refused or cut one with its reason.",
		"properties":  props,
	}
}

// networkUsageProps are the properties of a network's traffic, in a run's
// network and a sandbox's (wire.NetworkUsage).
func networkUsageProps() obj {
	count := obj{"type": "integer", "minimum": 0}
	return obj{
		"bytes_in":    count,
		"bytes_out":   count,
		"connections": count,
		"refused":     count,
		"attempts": obj{"type": "array", "items": obj{"type": "object", "properties": obj{
			"host":    obj{"type": "string"},
			"port":    obj{"type": "integer"},
			"kind":    obj{"type": "string", "description": "http or tls."},
			"allowed": obj{"type": "boolean"},
			"reason":  obj{"type": "string", "description": "Why it was refused or cut."},
		}}},
	}
}

// fileItemSchema is an entry of the files of run_code and create_sandbox.
func fileItemSchema() obj {
	return obj{
		"type": "object",
		"properties": obj{
			"path":     obj{"type": "string", "description": "Relative path with / separators, e.g. data/input.csv; no .. and no leading /."},
			"content":  contentProp(),
			"encoding": encodingProp(),
		},
		"required":             []any{"path", "content"},
		"additionalProperties": false,
	}
}

func contentProp() obj {
	return obj{"type": "string", "description": "The file's content: text, or base64 when encoding is base64."}
}

func encodingProp() obj {
	return obj{"type": "string", "enum": []any{"utf8", "base64"}, "default": "utf8",
		"description": "utf8 (the default) for text, base64 (standard, padded) for binary content."}
}
