package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"time"

	"github.com/kuboprotocol/vertal2kubo/client"
	"github.com/kuboprotocol/vertal2kubo/internal/lang"
)

// Exit statuses of the client commands when the program's own status is not
// what is reported. They follow `docker run`: 125 means the run itself could
// not happen (API refused it, server unreachable).
const (
	exitUsage     = 2
	exitAPIFailed = 125
)

// clientFlags are the connection flags shared by run and usage.
type clientFlags struct {
	url, key string
}

func (cf *clientFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&cf.url, "url", "", "API base URL (default $KUBO_API_URL, else "+client.DefaultBaseURL+")")
	fs.StringVar(&cf.key, "key", "", "API key (default $KUBO_API_KEY)")
}

func (cf *clientFlags) client(e *env) (*client.Client, error) {
	base := firstNonEmpty(cf.url, e.Getenv(client.EnvURL), client.DefaultBaseURL)
	key := firstNonEmpty(cf.key, e.Getenv(client.EnvKey))
	if key == "" {
		return nil, errors.New("no API key: pass --key or set KUBO_API_KEY")
	}
	return client.New(base, key, client.WithUserAgent("vertal-cli/"+version))
}

// clientOrUsage is client for the subcommand name ("sandbox exec"): an
// error (no API key, a bad URL) goes to stderr and is a usage error.
func (cf *clientFlags) clientOrUsage(e *env, name string) (*client.Client, error) {
	c, err := cf.client(e)
	if err != nil {
		fmt.Fprintf(e.Stderr, "vertal %s: %v\n", name, err)
		return nil, exitCode(exitUsage)
	}
	return c, nil
}

func cmdRun(ctx context.Context, e *env, args []string) error {
	fs := newFlagSet(e, "run", `run [flags] CODE | FILE | - [-- ARGS...]

Runs code on a Vertal Run server and mirrors the program: its stdout and
stderr go to this command's stdout and stderr as the program writes them,
and vertal run exits with the program's exit code. If the API refuses the
request or cannot be reached, the error's code, message and request id go
to stderr and the exit status is 125.

  vertal run "print('hello')"
  vertal run "console.log(6*7)" --language javascript --timeout 5
  vertal run script.py --stdin "input text"
  echo 'echo hi' | vertal run - -l bash
  vertal run plot.py --file data.csv --return '*.png' --out results
  vertal run 'echo "$GREETING $1"' -l bash --env GREETING=hi -- world
  vertal run fetch.py --allow pypi.org --allow '*.pythonhosted.org'
  id=$(vertal run --async job.py --webhook https://example.com/hook) && vertal wait "$id"

Returned files are written under --out (subdirectories are created; a
path that would leave it or go through a symlink is refused), one line per
file on stderr. With --json and no --out they stay in the JSON only.

The program reaches the network only as the plan's egress allowlist lets
it (the built-in plans allow nothing). --allow narrows that list to the
rules given (a host name, *.suffix or an address range within the plan's;
one beyond it is refused with 403), and --no-network runs it without any.
With --json the response's network shows what it reached and what was
refused, and why.

With --async the server queues the run and vertal run prints its id (or,
with --json, the queued execution) and exits 0 without waiting; vertal
wait ID prints the result as vertal run would have, returned files
included.`)
	var (
		cf        clientFlags
		language  string
		imageName string
		timeout   float64
		stdin     string
		asJSON    bool
		idemKey   string
		noStream  bool
		files     []client.File
		envVars   = map[string]string{}
		progArgs  []string
		globs     []string
		outDir    string
		async     bool
		webhook   string
		network   networkFlags
	)
	cf.register(fs)
	fs.StringVar(&language, "language", "", "python, javascript or bash (default: from the file extension, else python)")
	fs.StringVar(&language, "l", "", "shorthand for --language")
	fs.StringVar(&imageName, "image", "", "image to run on, e.g. datasci (default: the server's default image; see GET /v1/images)")
	fs.Float64Var(&timeout, "timeout", 0, "wall-clock limit in seconds (default: the server's, 10 s)")
	fs.StringVar(&stdin, "stdin", "", "text fed to the program's standard input; - reads it from this command's stdin")
	fs.BoolVar(&asJSON, "json", false, "print the whole API response as JSON instead of the program's output")
	fs.StringVar(&idemKey, "idempotency-key", "", "retry-safe key: the same key and code return the first result")
	fs.BoolVar(&noStream, "no-stream", false, "wait for the end and print the output at once instead of as it comes")
	fs.Func("file", "put a local file in the program's working directory, as LOCAL or LOCAL:PATH (PATH defaults to the base name; repeatable)", func(v string) error {
		f, err := readFileFlag(v)
		files = append(files, f)
		return err
	})
	fs.Func("env", "set an environment variable of the program, K=V, or K to pass this command's value (repeatable)", func(v string) error {
		name, value, ok := strings.Cut(v, "=")
		if !ok {
			if value, ok = lookupEnv(e, name); !ok {
				return fmt.Errorf("%s is not set here; give it as %s=VALUE", name, name)
			}
		}
		if name == "" {
			return errors.New("want NAME=VALUE")
		}
		envVars[name] = value
		return nil
	})
	fs.Func("arg", "pass an argument to the program (repeatable; arguments after -- are passed too)", func(v string) error {
		progArgs = append(progArgs, v)
		return nil
	})
	fs.Func("return", "return the files matching this glob, relative to the working directory, e.g. '*.png' or 'out/**' (repeatable)", func(v string) error {
		globs = append(globs, v)
		return nil
	})
	fs.StringVar(&outDir, "out", "", "directory the returned files are written to (default: the current one; with --json only when given)")
	fs.BoolVar(&async, "async", false, "queue the run and print its id at once (with --json: the queued execution); vertal wait ID gets the result")
	fs.StringVar(&webhook, "webhook", "", "with --async: URL (https) the server POSTs the signed result to when the run ends")
	network.register(fs, "the program", "run")
	// The flag package calls Usage after every parse error too; the whole
	// text is printed only for -h, so that an error stays on screen.
	usage := fs.Usage
	fs.Usage = func() {}
	positional, rest, err := parseInterspersed(fs, args)
	if err != nil {
		if errors.Is(err, flag.ErrHelp) {
			usage()
			return nil
		}
		fmt.Fprintln(e.Stderr, "vertal run: see vertal run -h for the flags")
		return exitCode(exitUsage)
	}
	if len(positional) == 0 && len(rest) > 0 {
		// vertal run [flags] -- CODE ARGS...
		positional, rest = rest[:1], rest[1:]
	}
	progArgs = append(progArgs, rest...)
	if len(positional) != 1 {
		fmt.Fprintln(e.Stderr, "vertal run: want exactly one CODE, FILE or -; see vertal run -h")
		return exitCode(exitUsage)
	}
	if webhook != "" && !async {
		fmt.Fprintln(e.Stderr, "vertal run: --webhook needs --async: a run waited for has no webhook")
		return exitCode(exitUsage)
	}
	if timeout < 0 {
		fmt.Fprintln(e.Stderr, "vertal run: --timeout must be a positive number of seconds")
		return exitCode(exitUsage)
	}
	if err := network.check(e, "run"); err != nil {
		return err
	}

	code, inferred, err := readCode(positional[0], e.Stdin, language != "")
	if err != nil {
		fmt.Fprintf(e.Stderr, "vertal run: %v\n", err)
		return exitCode(exitUsage)
	}
	if stdin == "-" {
		if positional[0] == "-" {
			fmt.Fprintln(e.Stderr, "vertal run: the code and --stdin cannot both come from standard input")
			return exitCode(exitUsage)
		}
		b, err := io.ReadAll(e.Stdin)
		if err != nil {
			return fmt.Errorf("reading standard input: %w", err)
		}
		stdin = string(b)
	}
	language = firstNonEmpty(language, inferred, "python")

	c, err := cf.clientOrUsage(e, "run")
	if err != nil {
		return err
	}
	opts := []client.RunOption{client.WithImage(imageName), client.WithLanguage(language),
		client.WithFiles(files...), client.WithEnv(envVars), client.WithArgs(progArgs...), client.WithReturnFiles(globs...)}
	if timeout > 0 {
		opts = append(opts, client.WithTimeout(time.Duration(timeout*float64(time.Second))))
	}
	if stdin != "" {
		opts = append(opts, client.WithStdin(stdin))
	}
	if idemKey != "" {
		opts = append(opts, client.WithIdempotencyKey(idemKey))
	}
	if network.given() {
		opts = append(opts, client.WithNetwork(network.allow...))
	}

	if async {
		return submitRun(ctx, e, c, code, append(opts, client.WithWebhook(webhook)), asJSON)
	}

	var ex *client.Execution
	if asJSON || noStream {
		// --json prints one document at the end, so it never streams.
		if ex, err = c.Run(ctx, code, opts...); err != nil {
			return reportClientError(e, "run", c, err)
		}
		printOutput(e, ex, asJSON)
	} else if ex, err = streamRun(ctx, e, c, code, opts); err != nil {
		return err
	}
	return finishRun(e, "run", ex, outDir, asJSON)
}

// finishRun reports a final execution as `vertal run` does once the
// output is printed: why it ended, the returned files written under
// outDir, and the program's exit code as this command's. vertal wait
// shares it, so a run waited for reads exactly like one run in place.
func finishRun(e *env, cmd string, ex *client.Execution, outDir string, asJSON bool) error {
	if !asJSON {
		reportOutcome(e, cmd, ex)
	}
	// With --json the files are in the document; they are written only
	// where --out asks, never into the current directory unasked.
	var filesErr error
	switch {
	case outDir != "":
		filesErr = writeReturnedFiles(e, cmd, outDir, ex)
	case !asJSON:
		filesErr = writeReturnedFiles(e, cmd, ".", ex)
	}
	if filesErr != nil {
		fmt.Fprintf(e.Stderr, "vertal %s: %v\n", cmd, filesErr)
	}
	switch {
	case ex.Status == client.StatusSucceeded && filesErr != nil:
		return exitCode(1) // the caller asked for files it did not get
	case ex.Status == client.StatusSucceeded:
		return nil
	case ex.ExitCode > 0 && ex.ExitCode < 256:
		return exitCode(ex.ExitCode)
	default:
		return exitCode(1)
	}
}

// printOutput writes a finished execution as one document (--json) or its
// stdout and stderr to this command's.
func printOutput(e *env, ex *client.Execution, asJSON bool) {
	if asJSON {
		writeJSON(e.Stdout, ex.Raw)
		return
	}
	io.WriteString(e.Stdout, ex.Stdout)
	io.WriteString(e.Stderr, ex.Stderr)
}

// submitRun queues the code and prints the execution's id, or with
// --json the whole queued execution.
func submitRun(ctx context.Context, e *env, c *client.Client, code string, opts []client.RunOption, asJSON bool) error {
	ex, err := c.Submit(ctx, code, opts...)
	if err != nil {
		return reportClientError(e, "run", c, err)
	}
	if asJSON {
		writeJSON(e.Stdout, ex.Raw)
	} else {
		fmt.Fprintln(e.Stdout, ex.ID)
	}
	return nil
}

// streamRun runs the code with Stream, writing each chunk of output to
// this command's stdout or stderr as it arrives, and returns the result.
func streamRun(ctx context.Context, e *env, c *client.Client, code string, opts []client.RunOption) (*client.Execution, error) {
	var execID string
	for ev, err := range c.Stream(ctx, code, opts...) {
		if err != nil {
			if execID != "" && errors.Is(err, context.Canceled) {
				// The run goes on on the server; say where to find it.
				fmt.Fprintf(e.Stderr, "vertal run: interrupted; %s keeps running and its result will be stored\n", execID)
				return nil, exitCode(exitAPIFailed)
			}
			return nil, reportClientError(e, "run", c, err)
		}
		switch ev.Type {
		case client.EventStarted:
			execID = ev.ExecutionID
		case client.EventStdout:
			io.WriteString(e.Stdout, ev.Text)
		case client.EventStderr:
			io.WriteString(e.Stderr, ev.Text)
		case client.EventResult:
			return ev.Execution, nil
		}
	}
	// Stream always ends with a result or an error; this is a safety net.
	fmt.Fprintln(e.Stderr, "vertal run: the event stream ended without a result")
	return nil, exitCode(exitAPIFailed)
}

// reportOutcome tells a person why a run ended when its output does not
// say so.
func reportOutcome(e *env, cmd string, ex *client.Execution) {
	switch {
	case ex.Status == client.StatusTimedOut:
		fmt.Fprintf(e.Stderr, "vertal %s: timed out (%s, %s)\n", cmd, time.Duration(ex.DurationMS)*time.Millisecond, ex.ID)
	case ex.Status == client.StatusMemoryExceeded:
		fmt.Fprintf(e.Stderr, "vertal %s: memory limit exceeded (%s)\n", cmd, ex.ID)
	case ex.Status == client.StatusError && ex.Reason != "":
		fmt.Fprintf(e.Stderr, "vertal %s: the execution ended in error: %s (%s, request %s)\n", cmd, ex.Reason, ex.ID, ex.RequestID)
	case ex.Status == client.StatusError:
		fmt.Fprintf(e.Stderr, "vertal %s: the sandbox failed (%s, request %s)\n", cmd, ex.ID, ex.RequestID)
	case ex.Status == client.StatusCanceled && ex.Reason != "":
		fmt.Fprintf(e.Stderr, "vertal %s: canceled: %s (%s)\n", cmd, ex.Reason, ex.ID)
	case ex.Status == client.StatusCanceled:
		fmt.Fprintf(e.Stderr, "vertal %s: canceled (%s)\n", cmd, ex.ID)
	}
	if ex.Truncated {
		fmt.Fprintf(e.Stderr, "vertal %s: output truncated at the per-stream limit (64 KB)\n", cmd)
	}
}

// lookupEnv reads this command's environment; an empty value counts as
// unset, as env.Getenv cannot tell them apart.
func lookupEnv(e *env, name string) (string, bool) {
	v := e.Getenv(name)
	return v, v != ""
}

func cmdUsage(ctx context.Context, e *env, args []string) error {
	fs := newFlagSet(e, "usage", "usage [flags]\n\nShows today's usage (UTC) and the plan's limits for the API key.")
	var (
		cf     clientFlags
		asJSON bool
	)
	cf.register(fs)
	fs.BoolVar(&asJSON, "json", false, "print the API response as JSON")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		fmt.Fprintln(e.Stderr, "vertal usage: takes no arguments")
		return exitCode(exitUsage)
	}
	c, err := cf.clientOrUsage(e, "usage")
	if err != nil {
		return err
	}
	u, err := c.Usage(ctx)
	if err != nil {
		return reportClientError(e, "usage", c, err)
	}
	if asJSON {
		writeJSON(e.Stdout, u.Raw)
		return nil
	}
	fmt.Fprintf(e.Stdout, "tenant  %s\nplan    %s\ntoday   %d executions, %.3f sandbox seconds (UTC day)\n",
		u.Tenant, u.Plan, u.Today.Executions, u.Today.SandboxSeconds)
	if sb := u.Sandboxes; sb != nil {
		fmt.Fprintf(e.Stdout, "sandboxes  %d running, %d paused; today %.3f seconds alive, %.3f CPU seconds\n",
			sb.Running, sb.Paused, sb.SandboxSeconds, sb.CPUSeconds)
	}
	// Print every limit the server reports, not only the ones this
	// version knows, so a newer server's limits show up too.
	var raw struct {
		Limits map[string]json.RawMessage `json:"limits"`
	}
	if json.Unmarshal(u.Raw, &raw) == nil && len(raw.Limits) > 0 {
		names := make([]string, 0, len(raw.Limits))
		for k := range raw.Limits {
			names = append(names, k)
		}
		sort.Strings(names)
		fmt.Fprintln(e.Stdout, "limits")
		for _, k := range names {
			fmt.Fprintf(e.Stdout, "  %-20s %s\n", k, raw.Limits[k])
		}
	}
	return nil
}

// fileLike is an argument that reads as a file name (main.py, src/t.ts)
// rather than as code: one word ending in a short extension.
var fileLike = regexp.MustCompile(`^[\w./~-]*\w\.[A-Za-z][A-Za-z0-9]{0,4}$`)

// readCode resolves the positional argument: "-" is standard input, an
// existing regular file is read (its extension names the language, unless
// --language does), and anything else is the code itself. An argument
// that reads as a file name but names no file, or a file whose extension
// is no language's, is an error rather than code to run as Python.
func readCode(arg string, stdin io.Reader, languageGiven bool) (code, language string, err error) {
	if arg == "-" {
		b, err := io.ReadAll(stdin)
		if err != nil {
			return "", "", fmt.Errorf("reading code from standard input: %w", err)
		}
		return string(b), "", nil
	}
	ext := strings.ToLower(filepath.Ext(arg))
	if fi, err := os.Stat(arg); err == nil && fi.Mode().IsRegular() {
		name, known := lang.ByExt(ext)
		if !known && !languageGiven {
			return "", "", fmt.Errorf("%s: the extension %q is no language's; name one with --language", arg, ext)
		}
		b, err := os.ReadFile(arg)
		if err != nil {
			return "", "", fmt.Errorf("reading code file: %w", err)
		}
		return string(b), name, nil
	}
	if fileLike.MatchString(arg) {
		if _, known := lang.ByExt(ext); !known {
			return "", "", fmt.Errorf("%s: no such file, and %q is no language's extension", arg, ext)
		}
		return "", "", fmt.Errorf("%s: no such file (to run text as code, pass the code itself or - for standard input)", arg)
	}
	return arg, "", nil
}

// reportClientError prints an API or connection error for a person: code,
// message and request id for API errors, and returns exit status 125.
func reportClientError(e *env, cmd string, c *client.Client, err error) error {
	var apiErr *client.Error
	switch {
	case errors.As(err, &apiErr):
		// An error event of a stream has no HTTP status of its own.
		var details []string
		if apiErr.StatusCode != 0 {
			details = append(details, fmt.Sprintf("HTTP %d", apiErr.StatusCode))
		}
		if apiErr.RequestID != "" {
			details = append(details, "request id "+apiErr.RequestID)
		}
		if apiErr.RetryAfter > 0 {
			details = append(details, fmt.Sprintf("retry after %s", apiErr.RetryAfter))
		}
		fmt.Fprintf(e.Stderr, "vertal %s: %s: %s", cmd, apiErr.Code, apiErr.Message)
		if len(details) > 0 {
			fmt.Fprintf(e.Stderr, " (%s)", strings.Join(details, ", "))
		}
		fmt.Fprintln(e.Stderr)
	case errors.Is(err, context.Canceled):
		fmt.Fprintf(e.Stderr, "vertal %s: interrupted\n", cmd)
	default:
		fmt.Fprintf(e.Stderr, "vertal %s: cannot reach %s: %v\n", cmd, c.BaseURL(), err)
	}
	return exitCode(exitAPIFailed)
}

func writeJSON(w io.Writer, raw []byte) {
	var buf bytes.Buffer
	if json.Indent(&buf, raw, "", "  ") != nil {
		buf.Reset()
		buf.Write(raw)
	}
	buf.WriteByte('\n')
	w.Write(buf.Bytes())
}

func firstNonEmpty(vs ...string) string {
	for _, v := range vs {
		if v != "" {
			return v
		}
	}
	return ""
}

// networkFlags are --allow and --no-network, of run and sandbox create.
type networkFlags struct {
	allow     []string
	noNetwork bool
}

// register adds the two flags to fs; who may reach, verb is what runs
// without a network.
func (n *networkFlags) register(fs *flag.FlagSet, who, verb string) {
	fs.Func("allow", "a host name, *.suffix or address range "+who+" may reach, within the plan's egress allowlist (repeatable; default: the plan's whole list)", func(v string) error {
		if v == "" {
			return errors.New("want a host name, *.suffix or an address range (--no-network for none)")
		}
		n.allow = append(n.allow, v)
		return nil
	})
	fs.BoolVar(&n.noNetwork, "no-network", false, verb+" without any network, whatever the plan allows")
}

// check refuses the two together, as a usage error of command.
func (n *networkFlags) check(e *env, command string) error {
	if n.noNetwork && len(n.allow) > 0 {
		fmt.Fprintf(e.Stderr, "vertal %s: --allow and --no-network cannot go together\n", command)
		return exitCode(exitUsage)
	}
	return nil
}

// given reports whether either was given: without them the plan's whole
// list applies.
func (n *networkFlags) given() bool { return n.noNetwork || len(n.allow) > 0 }
