package main

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/kuboprotocol/vertal2kubo/client"
	"github.com/kuboprotocol/vertal2kubo/client/wire"
)

// cmdSandbox dispatches `vertal sandbox <subcommand>`: the client of
// sandboxes that stay, through the Go SDK.
func cmdSandbox(ctx context.Context, e *env, args []string) error {
	if len(args) == 0 || args[0] == "-h" || args[0] == "--help" || args[0] == "help" {
		fmt.Fprintln(e.Stderr, "usage: vertal sandbox create|ls|exec|run-code|cp|pause|resume|rm [flags]\n\n"+
			"  create    start a sandbox that stays and print its id\n"+
			"  ls        list the key's sandboxes\n"+
			"  exec      run a command in a sandbox, mirroring its output and exit code\n"+
			"  run-code  run a cell of Python or JavaScript in a code context that keeps its state\n"+
			"  cp      copy a file into a sandbox (FILE sbx_ID:PATH) or out of one (sbx_ID:PATH FILE)\n"+
			"  pause   pause sandboxes (their files are kept, their processes end)\n"+
			"  resume  resume paused sandboxes\n"+
			"  rm      end sandboxes")
		if len(args) == 0 {
			return exitCode(exitUsage)
		}
		return nil
	}
	switch args[0] {
	case "create":
		return cmdSandboxCreate(ctx, e, args[1:])
	case "ls":
		return cmdSandboxList(ctx, e, args[1:])
	case "exec":
		return cmdSandboxExec(ctx, e, args[1:])
	case "run-code":
		return cmdSandboxRunCode(ctx, e, args[1:])
	case "cp":
		return cmdSandboxCopy(ctx, e, args[1:])
	case "pause", "resume", "rm":
		return cmdSandboxEach(ctx, e, args[0], args[1:])
	}
	fmt.Fprintf(e.Stderr, "vertal sandbox: unknown subcommand %q (want create, ls, exec, run-code, cp, pause, resume or rm)\n", args[0])
	return exitCode(exitUsage)
}

// keyValues is a repeatable K=V flag.
func keyValues(fs *flag.FlagSet, name, usage string) map[string]string {
	m := map[string]string{}
	fs.Func(name, usage, func(v string) error {
		k, val, ok := strings.Cut(v, "=")
		if !ok || k == "" {
			return errors.New("want K=V")
		}
		m[k] = val
		return nil
	})
	return m
}

// sandboxClient parses fs and makes the client; n is how many positional
// arguments the command wants (-1: at least one).
func sandboxClient(e *env, fs *flag.FlagSet, cf *clientFlags, name string, args []string, n int) (*client.Client, []string, error) {
	positional, rest, err := parseInterspersed(fs, args)
	if err != nil {
		return nil, nil, parseError(err)
	}
	positional = append(positional, rest...)
	if (n >= 0 && len(positional) != n) || (n < 0 && len(positional) == 0) {
		fmt.Fprintf(e.Stderr, "vertal sandbox %s: wrong arguments; see vertal sandbox %s -h\n", name, name)
		return nil, nil, exitCode(exitUsage)
	}
	c, err := cf.clientOrUsage(e, "sandbox "+name)
	if err != nil {
		return nil, nil, err
	}
	return c, positional, nil
}

func printSandboxJSON(e *env, sb *client.Sandbox) {
	b, _ := json.MarshalIndent(sb, "", "  ")
	fmt.Fprintln(e.Stdout, string(b))
}

func cmdSandboxCreate(ctx context.Context, e *env, args []string) error {
	fs := newFlagSet(e, "sandbox create", `sandbox create [flags]

Starts a sandbox that stays until vertal sandbox rm or its timeout, and
prints its id. Files given with --file go under /home/user. Its commands
reach the network as the plan's egress allowlist lets them (the built-in
plans allow nothing): --allow narrows that list, --no-network asks for none.

  id=$(vertal sandbox create --timeout 30m --metadata team=ml --file data.csv)
  vertal sandbox exec "$id" 'wc -l data.csv'`)
	var (
		cf      clientFlags
		p       client.SandboxParams
		asJSON  bool
		network networkFlags
	)
	cf.register(fs)
	fs.StringVar(&p.Image, "image", "", "image to run (default: the server's default)")
	fs.DurationVar(&p.Timeout, "timeout", 0, "how long until it expires, e.g. 10m (default: the server's, 5m)")
	fs.StringVar(&p.OnTimeout, "on-timeout", "", "what happens at the timeout: kill (default) or pause")
	fs.StringVar(&p.IdempotencyKey, "idempotency-key", "", "the same key returns the same sandbox")
	fs.BoolVar(&asJSON, "json", false, "print the sandbox as JSON")
	network.register(fs, "its commands", "create it")
	p.Env = keyValues(fs, "env", "environment variable of every command, K=V (repeatable)")
	p.Metadata = keyValues(fs, "metadata", "label, K=V (repeatable)")
	fs.Func("file", "local file to place under /home/user, FILE or FILE:PATH (repeatable)", func(v string) error {
		local, remote, ok := strings.Cut(v, ":")
		if !ok {
			remote = filepath.Base(local)
		}
		b, err := os.ReadFile(local)
		if err != nil {
			return err
		}
		p.Files = append(p.Files, client.File{Path: remote, Content: b})
		return nil
	})
	c, _, err := sandboxClient(e, fs, &cf, "create", args, 0)
	if err != nil {
		return err
	}
	if err := network.check(e, "sandbox create"); err != nil {
		return err
	}
	if network.given() {
		p.Network = &wire.NetworkRequest{Allow: append([]string{}, network.allow...)}
	}
	sb, err := c.CreateSandbox(ctx, p)
	if err != nil {
		return reportClientError(e, "sandbox create", c, err)
	}
	if asJSON {
		printSandboxJSON(e, sb)
		return nil
	}
	fmt.Fprintln(e.Stdout, sb.ID)
	return nil
}

func cmdSandboxList(ctx context.Context, e *env, args []string) error {
	fs := newFlagSet(e, "sandbox ls", `sandbox ls [flags]

Lists the key's sandboxes, newest first: id, status, image, created and
expiry (or how it ended).`)
	var (
		cf     clientFlags
		p      client.ListParams
		status string
		asJSON bool
	)
	cf.register(fs)
	fs.StringVar(&status, "status", "", "only running, paused or ended ones")
	fs.BoolVar(&asJSON, "json", false, "print the sandboxes as JSON")
	p.Metadata = keyValues(fs, "metadata", "only those with this label, K=V (repeatable)")
	c, _, err := sandboxClient(e, fs, &cf, "ls", args, 0)
	if err != nil {
		return err
	}
	p.Status = client.SandboxStatus(status)
	var all []*client.Sandbox
	for {
		page, err := c.ListSandboxes(ctx, p)
		if err != nil {
			return reportClientError(e, "sandbox ls", c, err)
		}
		all = append(all, page.Sandboxes...)
		if p.Cursor = page.NextCursor; p.Cursor == "" {
			break
		}
	}
	if asJSON {
		b, _ := json.MarshalIndent(all, "", "  ")
		fmt.Fprintln(e.Stdout, string(b))
		return nil
	}
	tw := tabwriter.NewWriter(e.Stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "ID\tSTATUS\tIMAGE\tCREATED\tEXPIRES")
	for _, sb := range all {
		expires := sb.ExpiresAt.Format(time.RFC3339)
		if sb.Status == client.SandboxEnded {
			expires = "ended: " + sb.Reason
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", sb.ID, sb.Status, sb.Image, sb.CreatedAt.Format(time.RFC3339), expires)
	}
	return tw.Flush()
}

func cmdSandboxExec(ctx context.Context, e *env, args []string) error {
	fs := newFlagSet(e, "sandbox exec", `sandbox exec [flags] ID COMMAND | ID -- ARGV...

Runs a command in the sandbox ID, a shell line or (after --) an argv, and
mirrors it: its stdout and stderr as they come, its exit code as this
command's. If the API refuses or cannot be reached, the exit status is 125.

  vertal sandbox exec sbx_0123... 'pip list | head'
  vertal sandbox exec --cwd /tmp sbx_0123... -- ls -la`)
	var (
		cf      clientFlags
		cwd     string
		stdin   string
		timeout time.Duration
	)
	cf.register(fs)
	fs.StringVar(&cwd, "cwd", "", "working directory (default /home/user)")
	fs.StringVar(&stdin, "stdin", "", "text written to the command's standard input")
	fs.DurationVar(&timeout, "timeout", 0, "wall-clock limit (default: the plan's)")
	env := keyValues(fs, "env", "environment variable of the command, K=V (repeatable)")
	positional, argv, err := parseInterspersed(fs, args)
	if err != nil {
		return parseError(err)
	}
	if valid := (len(argv) == 0 && len(positional) == 2) || (len(argv) > 0 && len(positional) == 1); !valid {
		fmt.Fprintln(e.Stderr, "vertal sandbox exec: want ID and one shell line, or ID -- ARGV...; see vertal sandbox exec -h")
		return exitCode(exitUsage)
	}
	c, err := cf.clientOrUsage(e, "sandbox exec")
	if err != nil {
		return err
	}
	sb := c.Sandbox(positional[0])
	opts := []client.CommandOption{client.WithCwd(cwd), client.WithCommandEnv(env), client.WithCommandTimeout(timeout)}
	if stdin != "" {
		opts = append(opts, client.WithCommandStdin(stdin))
	}
	line := ""
	if len(argv) > 0 {
		opts = append(opts, client.WithArgv(argv...))
	} else {
		line = positional[1]
	}
	for ev, err := range sb.Commands.Stream(ctx, line, opts...) {
		if err != nil {
			return reportClientError(e, "sandbox exec", c, err)
		}
		switch ev.Type {
		case client.EventStdout:
			fmt.Fprint(e.Stdout, ev.Text)
		case client.EventStderr:
			fmt.Fprint(e.Stderr, ev.Text)
		case client.EventResult:
			if ev.Result.Status == client.StatusTimedOut || ev.Result.Status == client.StatusMemoryExceeded {
				fmt.Fprintf(e.Stderr, "vertal sandbox exec: %s\n", ev.Result.Status)
			}
			if ev.Result.ExitCode != 0 {
				return exitCode(ev.Result.ExitCode)
			}
			return nil
		}
	}
	fmt.Fprintln(e.Stderr, "vertal sandbox exec: the stream ended without a result")
	return exitCode(exitAPIFailed)
}

func cmdSandboxRunCode(ctx context.Context, e *env, args []string) error {
	fs := newFlagSet(e, "sandbox run-code", `sandbox run-code [flags] ID CODE|-

Runs one cell of code in a code context of the sandbox ID (Python's
default context unless --language or --context says otherwise), where
variables, imports and open files stay from one cell to the next. CODE is
the code itself, or - for standard input. The cell's stdout and stderr are
mirrored as they come, then the text of its last expression's value on
stdout and any error's traceback on stderr. Exit status: 0 when the cell
succeeded, 1 when it raised, 124 when it timed out (the context stays), 125
when the API refused or could not be reached. --json prints the whole
outcome instead (results as MIME bundles, images base64).

  vertal sandbox run-code sbx_0123... 'import pandas as pd; df = pd.read_csv("data.csv")'
  vertal sandbox run-code sbx_0123... 'df.describe()'
  vertal sandbox run-code --language javascript sbx_0123... 'const xs = [1, 2, 3]; xs.length'`)
	var (
		cf         clientFlags
		contextID  string
		language   string
		timeout    time.Duration
		jsonOutput bool
	)
	cf.register(fs)
	fs.StringVar(&contextID, "context", "", "the code context (ctx_...) to run in (default: the language's default context)")
	fs.StringVar(&language, "language", "", "python or javascript (default python)")
	fs.DurationVar(&timeout, "timeout", 0, "interrupt the cell after this long (default 60s, or the plan's max_timeout_s if lower)")
	fs.BoolVar(&jsonOutput, "json", false, "print the whole outcome as JSON")
	env := keyValues(fs, "env", "environment variable for this cell, K=V (repeatable)")
	positional, _, err := parseInterspersed(fs, args)
	if err != nil {
		return parseError(err)
	}
	if len(positional) != 2 {
		fmt.Fprintln(e.Stderr, "vertal sandbox run-code: want ID and CODE (or - for standard input); see vertal sandbox run-code -h")
		return exitCode(exitUsage)
	}
	code := positional[1]
	if code == "-" {
		b, err := io.ReadAll(e.Stdin)
		if err != nil {
			fmt.Fprintf(e.Stderr, "vertal sandbox run-code: reading standard input: %v\n", err)
			return exitCode(exitUsage)
		}
		code = string(b)
	}
	c, err := cf.clientOrUsage(e, "sandbox run-code")
	if err != nil {
		return err
	}
	sb := c.Sandbox(positional[0])
	opts := []client.CodeOption{client.InContext(contextID), client.WithCodeLanguage(language), client.WithCodeEnv(env), client.WithCodeTimeout(timeout)}
	var res *client.CodeResult
	if jsonOutput {
		if res, err = sb.RunCode(ctx, code, opts...); err != nil {
			return reportClientError(e, "sandbox run-code", c, err)
		}
		enc := json.NewEncoder(e.Stdout)
		enc.SetIndent("", "  ")
		if err := enc.Encode(res); err != nil {
			return err
		}
	} else {
		for ev, err := range sb.StreamCode(ctx, code, opts...) {
			if err != nil {
				return reportClientError(e, "sandbox run-code", c, err)
			}
			switch ev.Type {
			case client.EventStdout:
				fmt.Fprint(e.Stdout, ev.Text)
			case client.EventStderr:
				fmt.Fprint(e.Stderr, ev.Text)
			case client.EventResult:
				printCodeOutput(e, ev.Result)
			case client.EventError:
				fmt.Fprint(e.Stderr, strings.TrimSuffix(cmp.Or(ev.CodeError.Traceback, ev.CodeError.Name+": "+ev.CodeError.Value), "\n")+"\n")
			case client.EventEnd:
				res = ev.End
			}
		}
		if res == nil {
			fmt.Fprintln(e.Stderr, "vertal sandbox run-code: the stream ended without the cell's outcome")
			return exitCode(exitAPIFailed)
		}
	}
	switch res.Status {
	case client.StatusSucceeded:
		return nil
	case client.StatusTimedOut:
		if !jsonOutput {
			fmt.Fprintln(e.Stderr, "vertal sandbox run-code: timed_out (the cell was interrupted; the context stays)")
		}
		return exitCode(124)
	}
	return exitCode(1)
}

// printCodeOutput shows a result for a terminal: its text, and for what
// has no text worth showing (a figure), what it holds.
func printCodeOutput(e *env, o *client.CodeOutput) {
	if o.Main {
		fmt.Fprintln(e.Stdout, o.Data["text/plain"])
		return
	}
	var kinds []string
	for mime := range o.Data {
		if mime != "text/plain" {
			kinds = append(kinds, mime)
		}
	}
	sort.Strings(kinds)
	fmt.Fprintf(e.Stderr, "[%s: %s; --json has the data]\n", o.Data["text/plain"], strings.Join(kinds, ", "))
}

// sandboxRef splits "sbx_ID:PATH"; ok is false for a local path.
func sandboxRef(s string) (id, path string, ok bool) {
	id, path, ok = strings.Cut(s, ":")
	if !ok || !strings.HasPrefix(id, "sbx_") || path == "" {
		return "", "", false
	}
	return id, path, true
}

func cmdSandboxCopy(ctx context.Context, e *env, args []string) error {
	fs := newFlagSet(e, "sandbox cp", `sandbox cp [flags] SRC DST

Copies one file into a sandbox or out of one; the sandbox side is
sbx_ID:PATH (a relative PATH is under /home/user), the other a local file
(- for stdin or stdout). Copying to a local directory keeps the name.

  vertal sandbox cp data.csv sbx_0123...:/home/user/data.csv
  vertal sandbox cp sbx_0123...:out/plot.png .`)
	var cf clientFlags
	cf.register(fs)
	c, pos, err := sandboxClient(e, fs, &cf, "cp", args, 2)
	if err != nil {
		return err
	}
	srcID, srcPath, fromSandbox := sandboxRef(pos[0])
	dstID, dstPath, toSandbox := sandboxRef(pos[1])
	if fromSandbox == toSandbox {
		fmt.Fprintln(e.Stderr, "vertal sandbox cp: exactly one of SRC and DST must be sbx_ID:PATH")
		return exitCode(exitUsage)
	}
	if toSandbox {
		var content []byte
		if pos[0] == "-" {
			content, err = io.ReadAll(e.Stdin)
		} else {
			content, err = os.ReadFile(pos[0])
		}
		if err != nil {
			fmt.Fprintf(e.Stderr, "vertal sandbox cp: %v\n", err)
			return exitCode(1)
		}
		if _, err := c.Sandbox(dstID).Files.Write(ctx, dstPath, content); err != nil {
			return reportClientError(e, "sandbox cp", c, err)
		}
		return nil
	}
	sb := c.Sandbox(srcID)
	if pos[1] == "-" {
		if _, err := sb.Files.ReadTo(ctx, srcPath, e.Stdout); err != nil {
			return reportClientError(e, "sandbox cp", c, err)
		}
		return nil
	}
	content, err := sb.Files.Read(ctx, srcPath)
	if err != nil {
		return reportClientError(e, "sandbox cp", c, err)
	}
	dst := pos[1]
	if fi, err := os.Stat(dst); err == nil && fi.IsDir() {
		dst = filepath.Join(dst, filepath.Base(srcPath))
	}
	if err := os.WriteFile(dst, content, 0o644); err != nil {
		fmt.Fprintf(e.Stderr, "vertal sandbox cp: %v\n", err)
		return exitCode(1)
	}
	return nil
}

// cmdSandboxEach is pause, resume and rm: each ID in turn, printing it
// with its status after.
func cmdSandboxEach(ctx context.Context, e *env, name string, args []string) error {
	verb := map[string]string{"pause": "Pauses", "resume": "Resumes", "rm": "Ends"}[name]
	fs := newFlagSet(e, "sandbox "+name, "sandbox "+name+" [flags] ID...\n\n"+verb+" each sandbox and prints its id and status.")
	var cf clientFlags
	cf.register(fs)
	c, ids, err := sandboxClient(e, fs, &cf, name, args, -1)
	if err != nil {
		return err
	}
	failed := false
	for _, id := range ids {
		sb := c.Sandbox(id)
		switch name {
		case "pause":
			err = sb.Pause(ctx)
		case "resume":
			err = sb.Resume(ctx)
		default:
			err = sb.Kill(ctx)
		}
		if err != nil {
			reportClientError(e, "sandbox "+name, c, err)
			failed = true
			continue
		}
		fmt.Fprintf(e.Stdout, "%s\t%s\n", sb.ID, sb.Status)
	}
	if failed {
		return exitCode(exitAPIFailed)
	}
	return nil
}
