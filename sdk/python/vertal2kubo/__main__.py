"""Command line: ``python -m vertal2kubo run|wait|usage ...``.

The client commands talk to the API. The operator commands (serve,
create-key, ...) belong to the ``vertal`` server binary; they are handed to
it when it is on PATH.
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import json
import os
import shutil
import sys
from typing import Any, Optional, Sequence, TextIO

from ._files import ReturnedPathError, read_file_flag, write_beneath
from .client import KuboClient, KuboError

# Exit statuses when the program's own cannot be reported; like docker run,
# 125 means the run could not happen (refused, unreachable).
EXIT_USAGE = 2
EXIT_API_FAILED = 125

OPERATOR_COMMANDS = ("serve", "create-key", "revoke-key", "list-keys", "purge", "image", "doctor", "bench")

LANGUAGE_BY_EXT = {
    ".py": "python", ".js": "javascript", ".mjs": "javascript", ".cjs": "javascript",
    ".sh": "bash", ".bash": "bash",
}


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m vertal2kubo",
        description="Vertal Run client. Operator commands (" + ", ".join(OPERATOR_COMMANDS)
        + ") run the vertal binary if it is on PATH.")
    sub = p.add_subparsers(dest="command", metavar="COMMAND")

    def connection(sp: argparse.ArgumentParser) -> None:
        sp.add_argument("--url", help="API base URL (default $KUBO_API_URL)")
        sp.add_argument("--key", help="API key (default $KUBO_API_KEY)")

    run = sub.add_parser(
        "run", help="run code and mirror its output and exit code",
        usage="%(prog)s [flags] CODE | FILE | - [-- ARGS...]",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Run CODE (or the file it names, or standard input for -) on a Vertal Run\n"
        "server. The program's stdout and stderr go to this command's as the program\n"
        "writes them, and the exit status is the program's; 125 means the API refused\n"
        "the request or could not be reached.",
        epilog="""examples:
  python -m vertal2kubo run "print('hello')"
  python -m vertal2kubo run plot.py --file data.csv --return '*.png' --out results
  python -m vertal2kubo run 'echo "$GREETING $1"' -l bash --env GREETING=hi -- world
  python -m vertal2kubo run fetch.py --allow pypi.org --allow '*.pythonhosted.org'

Returned files are written under --out (subdirectories are created; a path
that would leave it or go through a symlink is refused), one line per file
on stderr.

The program reaches the network only as the plan's egress allowlist lets it
(the built-in plans allow nothing); --allow narrows that list and
--no-network runs it without any. With --json the response's network shows
what it reached and what was refused, and why.""")
    run.add_argument("code", metavar="CODE|FILE|-", nargs="?")
    run.add_argument("--language", "-l", help="python, javascript or bash (default: from the file extension, else python)")
    run.add_argument("--timeout", type=float, help="wall-clock limit in seconds (default: the server's, 10)")
    run.add_argument("--stdin", help="text for the program's standard input; - reads this command's stdin")
    run.add_argument("--json", action="store_true", help="print the whole API response as JSON")
    run.add_argument("--idempotency-key", help="retry-safe key: the same key and code return the first result")
    run.add_argument("--no-stream", action="store_true",
                     help="wait for the end and print the output at once instead of as it comes")
    run.add_argument("--file", action="append", default=[], metavar="LOCAL[:PATH]",
                     help="put a local file in the program's working directory (PATH defaults to the base name; repeatable)")
    run.add_argument("--env", action="append", default=[], metavar="K=V",
                     help="set an environment variable of the program, K=V, or K to pass this command's value (repeatable)")
    run.add_argument("--arg", action="append", default=[], metavar="A",
                     help="pass an argument to the program (repeatable; one starting with - as --arg=-x; arguments after -- are passed too)")
    run.add_argument("--return", dest="return_files", action="append", default=[], metavar="GLOB",
                     help="return the files matching this glob, relative to the working directory, e.g. '*.png' or 'out/**' (repeatable)")
    run.add_argument("--out", default=".", metavar="DIR", help="directory the returned files are written to (default .)")
    run.add_argument("--async", dest="async_", action="store_true",
                     help="queue the run and print its id at once (with --json: the queued execution); 'wait ID' gets the result")
    run.add_argument("--webhook", metavar="URL", help="with --async: URL (https) the server POSTs the signed result to")
    network_flags(run, "the program", "run")
    connection(run)

    wait = sub.add_parser(
        "wait", help="wait for an execution (e.g. run --async) and print it as run does",
        description="Wait until execution ID has finished, then print it as run does: its stdout\n"
        "and stderr, returned files under --out, and the program's exit code; 125 means\n"
        "the API refused (an unknown id is not_found) or could not be reached.",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    wait.add_argument("id", metavar="ID")
    wait.add_argument("--json", action="store_true", help="print the whole final execution as JSON")
    wait.add_argument("--out", default=".", metavar="DIR", help="directory the returned files are written to (default .)")
    connection(wait)

    sbx = sub.add_parser("sandbox", help="sandboxes that stay: create, ls, exec, cp, pause, resume, rm",
                         description="Sandboxes that stay: files and processes persist between commands.")
    sbx_sub = sbx.add_subparsers(dest="sandbox_command", metavar="SUBCOMMAND", required=True)
    create = sbx_sub.add_parser("create", help="create a sandbox and print its id")
    create.add_argument("--image", help="image name (default: the server's default image)")
    create.add_argument("--timeout", type=int, help="lifetime in seconds (default: the server's)")
    create.add_argument("--meta", action="append", default=[], metavar="K=V", help="metadata pair (repeatable)")
    create.add_argument("--on-timeout", choices=("kill", "pause"), help="what happens at the end of its lifetime")
    network_flags(create, "the sandbox", "create it")
    create.add_argument("--json", action="store_true", help="print the sandbox as JSON")
    ls = sbx_sub.add_parser("ls", help="list sandboxes: id, status, image, expires_at")
    ls.add_argument("--status", choices=("running", "paused", "ended"))
    ls.add_argument("--json", action="store_true", help="print the sandboxes as JSON")
    ex = sbx_sub.add_parser("exec", help="run a shell line in a sandbox; its output and exit code are the command's")
    ex.add_argument("id", metavar="ID")
    ex.add_argument("cmd", metavar="CMD", nargs="+", help="a shell line (several words are joined by spaces)")
    ex.add_argument("--timeout", type=int, help="the command's limit in seconds")
    cp = sbx_sub.add_parser("cp", help="copy a file: cp LOCAL ID:PATH uploads, cp ID:PATH LOCAL downloads (- is stdio)")
    cp.add_argument("src", metavar="SRC")
    cp.add_argument("dst", metavar="DST")
    for name, text in (("pause", "pause (files are kept)"), ("resume", "resume"), ("rm", "kill")):
        one = sbx_sub.add_parser(name, help=text + " a sandbox")
        one.add_argument("id", metavar="ID")
    for sp in (create, ls, ex, cp) + tuple(sbx_sub.choices[n] for n in ("pause", "resume", "rm")):
        connection(sp)

    usage = sub.add_parser("usage", help="show today's usage and the plan's limits")
    usage.add_argument("--json", action="store_true", help="print the API response as JSON")
    connection(usage)
    for name in OPERATOR_COMMANDS:
        sub.add_parser(name, help="operator command of the vertal binary", add_help=False)
    return p


def main(argv: Optional[Sequence[str]] = None, stdin: Optional[TextIO] = None,
         stdout: Optional[TextIO] = None, stderr: Optional[TextIO] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    stdin = stdin or sys.stdin
    stdout = stdout or sys.stdout
    stderr = stderr or sys.stderr

    if argv and argv[0] in OPERATOR_COMMANDS:
        return _operator(argv, stderr)
    # What follows "--" goes to the program (or, with no CODE before it,
    # is CODE and then the program's arguments), as `vertal run` has it.
    rest: list = []
    if argv and argv[0] == "run" and "--" in argv:
        at = argv.index("--")
        argv, rest = argv[:at], argv[at + 1:]
    parser = _parser()
    try:
        with contextlib.redirect_stderr(stderr), contextlib.redirect_stdout(stdout):
            args = parser.parse_args(argv)
    except SystemExit as e:  # argparse printed the problem (or the help)
        return int(e.code or 0)
    if args.command is None:
        parser.print_help(stderr)
        return EXIT_USAGE
    if args.command == "run":
        if args.code is None and rest:
            args.code, rest = rest[0], rest[1:]
        if args.code is None:
            print("vertal2kubo run: want exactly one CODE, FILE or -; see python -m vertal2kubo run -h", file=stderr)
            return EXIT_USAGE
        args.arg += rest
    try:
        client = KuboClient(args.url, args.key)
    except ValueError as e:
        print(f"vertal2kubo {args.command}: {e}", file=stderr)
        return EXIT_USAGE
    if args.command == "run":
        return _run(args, client, stdin, stdout, stderr)
    if args.command == "wait":
        return _wait(args, client, stdout, stderr)
    if args.command == "sandbox":
        try:
            return _sandbox(args, client, stdout, stderr)
        except KuboError as e:
            return _report(e, "sandbox " + args.sandbox_command, stderr)
    return _usage(args, client, stdout, stderr)


def _operator(argv: list, stderr: TextIO) -> int:
    binary = shutil.which("vertal")
    if binary is None:
        print(f"vertal2kubo: '{argv[0]}' is an operator command of the Vertal Run server binary "
              "'vertal', which is not on PATH. Build it from the repository with "
              "'go build ./cmd/vertal' (or use the container image) and run 'vertal "
              f"{argv[0]} ...' on the API host.", file=stderr)
        return 127
    stderr.flush()
    os.execv(binary, ["vertal", *argv])
    return 127  # not reached


def _read_code(arg: str, stdin: TextIO) -> tuple[str, Optional[str]]:
    if arg == "-":
        return stdin.read(), None
    if os.path.isfile(arg):
        with open(arg, encoding="utf-8") as f:
            return f.read(), LANGUAGE_BY_EXT.get(os.path.splitext(arg)[1].lower())
    return arg, None


def network_flags(p: argparse.ArgumentParser, who: str, verb: str) -> None:
    """--allow and --no-network, for run and sandbox create."""
    p.add_argument("--allow", action="append", default=[], metavar="RULE",
                   help=f"a host name, *.suffix or address range {who} may reach, within the plan's egress "
                   "allowlist (repeatable; default: the plan's whole list)")
    p.add_argument("--no-network", action="store_true", help=f"{verb} without any network, whatever the plan allows")


def _network(args: argparse.Namespace) -> tuple[Optional[list], Optional[str]]:
    """The network of --allow and --no-network (None: the plan's list), or
    what is wrong with them."""
    if args.allow and args.no_network:
        return None, "--allow and --no-network cannot go together"
    if "" in args.allow:
        return None, "--allow: want a host name, *.suffix or an address range (--no-network for none)"
    return args.allow or ([] if args.no_network else None), None


def _run_options(args: argparse.Namespace) -> tuple[Optional[dict], Optional[str]]:
    """The files, env, args, return_files and network of run(), or what is
    wrong with the flags that give them."""
    network, problem = _network(args)
    if problem:
        return None, problem
    files = []
    for value in args.file:
        try:
            files.append(read_file_flag(value))
        except (OSError, ValueError) as e:
            reason = f"{e.strerror}: {e.filename}" if isinstance(e, OSError) and e.strerror else str(e)
            return None, f"--file {value}: {reason}"
    env = {}
    for value in args.env:
        name, eq, v = value.partition("=")
        if not eq:
            v = os.environ.get(name, "")
            if not v:
                return None, f"--env {value}: {name} is not set here; give it as {name}=VALUE"
        if name == "":
            return None, f"--env {value}: want NAME=VALUE"
        env[name] = v
    return {"files": files, "env": env, "args": args.arg, "return_files": args.return_files, "network": network}, None


def _run(args: argparse.Namespace, client: KuboClient, stdin: TextIO, stdout: TextIO, stderr: TextIO) -> int:
    if args.webhook and not args.async_:
        print("vertal2kubo run: --webhook needs --async: a run waited for has no webhook", file=stderr)
        return EXIT_USAGE
    if args.timeout is not None and args.timeout <= 0:
        print("vertal2kubo run: --timeout must be a positive number of seconds", file=stderr)
        return EXIT_USAGE
    if args.code == "-" and args.stdin == "-":
        print("vertal2kubo run: the code and --stdin cannot both come from standard input", file=stderr)
        return EXIT_USAGE
    options, problem = _run_options(args)
    if problem:
        print(f"vertal2kubo run: {problem}", file=stderr)
        return EXIT_USAGE
    try:
        code, inferred = _read_code(args.code, stdin)
    except OSError as e:
        print(f"vertal2kubo run: reading code file: {e}", file=stderr)
        return EXIT_USAGE
    program_stdin = stdin.read() if args.stdin == "-" else args.stdin
    timeout = args.timeout
    if timeout is not None and float(timeout).is_integer():
        timeout = int(timeout)
    request = dict(options, language=args.language or inferred or "python", timeout_s=timeout,
                   idempotency_key=args.idempotency_key, stdin=program_stdin)

    if args.async_:
        try:
            queued = client.submit(code, webhook_url=args.webhook, **request)
        except KeyboardInterrupt:
            print("vertal2kubo run: interrupted", file=stderr)
            return EXIT_API_FAILED
        except KuboError as e:
            return _report(e, "run", stderr)
        print(json.dumps(_as_sent(queued), indent=2) if args.json else queued["id"], file=stdout)
        return 0
    if args.json or args.no_stream:
        # --json prints one document at the end, so it never streams.
        try:
            result = client.run(code, **request)
        except KeyboardInterrupt:
            print("vertal2kubo run: interrupted", file=stderr)
            return EXIT_API_FAILED
        except KuboError as e:
            return _report(e, "run", stderr)
        _print_output(result, args.json, stdout, stderr)
    else:
        result, failed = _stream_run(client, code, request, stdout, stderr)
        if result is None:
            return failed
    return _finish(result, "run", args, stdout, stderr)


def _finish(result: dict, command: str, args: argparse.Namespace, stdout: TextIO, stderr: TextIO) -> int:
    """Report a final execution as run does once its output is printed:
    why it ended, the returned files under --out, and the program's exit
    code as this command's. wait shares it, so both read the same."""
    status = result.get("status")
    if not args.json:
        _report_outcome(result, command, stderr)
    stdout.flush()
    files_problem = _write_returned_files(args.out, result, command, stderr)
    if files_problem:
        print(f"vertal2kubo {command}: {files_problem}", file=stderr)
    exit_code = result.get("exit_code") or 0
    if status == "succeeded":
        return 1 if files_problem else 0  # the caller asked for files it did not get
    return exit_code if 0 < exit_code < 256 else 1


def _wait(args: argparse.Namespace, client: KuboClient, stdout: TextIO, stderr: TextIO) -> int:
    try:
        result = client.wait(args.id)
    except KeyboardInterrupt:
        print(f"vertal2kubo wait: interrupted; {args.id} goes on", file=stderr)
        return EXIT_API_FAILED
    except KuboError as e:
        return _report(e, "wait", stderr)
    _print_output(result, args.json, stdout, stderr)
    return _finish(result, "wait", args, stdout, stderr)


def _print_output(result: dict, as_json: bool, stdout: TextIO, stderr: TextIO) -> None:
    """A finished execution as one JSON document, or its stdout and stderr."""
    if as_json:
        print(json.dumps(_as_sent(result), indent=2), file=stdout)
    else:
        stdout.write(result.get("stdout", ""))
        stderr.write(result.get("stderr", ""))


def _stream_run(client: KuboClient, code: str, request: dict, stdout: TextIO, stderr: TextIO) -> tuple[Optional[dict], int]:
    """Run with stream(), writing each chunk of output to this command's
    stdout or stderr as it arrives; (the execution, 0) or (None, exit status)."""
    execution_id = None
    events = client.stream(code, **request)
    try:
        for event in events:
            kind = event["type"]
            if kind == "started":
                execution_id = event["execution_id"]
            elif kind in ("stdout", "stderr"):
                out = stdout if kind == "stdout" else stderr
                out.write(event["text"])
                out.flush()
            elif kind == "result":
                return event["execution"], 0
    except KeyboardInterrupt:
        if execution_id:
            # The run goes on on the server; say where to find it.
            print(f"vertal2kubo run: interrupted; {execution_id} keeps running and its result will be stored", file=stderr)
        else:
            print("vertal2kubo run: interrupted", file=stderr)
        return None, EXIT_API_FAILED
    except KuboError as e:
        return None, _report(e, "run", stderr)
    finally:
        events.close()
    # stream() always ends with a result or an error; this is a safety net.
    print("vertal2kubo run: the event stream ended without a result", file=stderr)
    return None, EXIT_API_FAILED


def _report_outcome(result: dict, command: str, stderr: TextIO) -> None:
    """Tell a person why a run ended when its output does not say so."""
    status, reason, prefix = result.get("status"), result.get("reason"), f"vertal2kubo {command}:"
    if status == "timed_out":
        print(f"{prefix} timed out ({result.get('duration_ms', 0) / 1000:g}s, {result.get('id')})", file=stderr)
    elif status == "memory_exceeded":
        print(f"{prefix} memory limit exceeded ({result.get('id')})", file=stderr)
    elif status == "error" and reason:
        print(f"{prefix} the execution ended in error: {reason} ({result.get('id')}, request {result.get('request_id')})", file=stderr)
    elif status == "error":
        print(f"{prefix} the sandbox failed ({result.get('id')}, request {result.get('request_id')})", file=stderr)
    elif status == "canceled":
        print(f"{prefix} canceled{': ' + reason if reason else ''} ({result.get('id')})", file=stderr)
    if result.get("truncated"):
        print(f"{prefix} output truncated at the per-stream limit (64 KB)", file=stderr)


def _write_returned_files(out_dir: str, result: dict, command: str, stderr: TextIO) -> Optional[str]:
    """Write the returned files under out_dir, one line per file on stderr;
    what went wrong, or None."""
    if result.get("files_truncated"):
        print(f"vertal2kubo {command}: returned files truncated at the plan's limit (count or size)", file=stderr)
    files = result.get("files") or []
    if not files:
        return None
    try:
        os.makedirs(out_dir, 0o755, exist_ok=True)
    except OSError as e:
        return f"creating --out directory: {e}"
    failed = 0
    for f in files:
        path, content = f.get("path") or "", f.get("content") or b""
        try:
            write_beneath(out_dir, path, content)
        except (OSError, ReturnedPathError) as e:
            print(f"vertal2kubo {command}: not writing returned file {json.dumps(path)}: {e}", file=stderr)
            failed += 1
            continue
        shown = os.path.join(out_dir, *path.split("/"))
        print(f"vertal2kubo {command}: wrote {shown} ({len(content)} bytes)", file=stderr)
    if failed:
        return f"{failed} of {len(files)} returned files were not written"
    return None


def _as_sent(result: dict) -> dict:
    """The execution as the API sent it: returned files' content in base64."""
    files = result.get("files")
    if not isinstance(files, list):
        return result
    return dict(result, files=[dict(f, encoding="base64", content=base64.b64encode(f["content"]).decode("ascii"))
                               if isinstance(f.get("content"), (bytes, bytearray)) else f for f in files])


def _usage(args: argparse.Namespace, client: KuboClient, stdout: TextIO, stderr: TextIO) -> int:
    try:
        u = client.usage()
    except KuboError as e:
        return _report(e, "usage", stderr)
    if args.json:
        print(json.dumps(u, indent=2), file=stdout)
        return 0
    today = u.get("today", {})
    print(f"tenant  {u.get('tenant')}\nplan    {u.get('plan')}\n"
          f"today   {today.get('executions', 0)} executions, {today.get('sandbox_seconds', 0):.3f} sandbox seconds (UTC day)",
          file=stdout)
    limits = u.get("limits") or {}
    if limits:
        print("limits", file=stdout)
        for k in sorted(limits):
            print(f"  {k:<20} {json.dumps(limits[k])}", file=stdout)
    return 0


def _sandbox(args: argparse.Namespace, client: KuboClient, stdout: TextIO, stderr: TextIO) -> int:
    """python -m vertal2kubo sandbox SUBCOMMAND; KuboError is the caller's to report."""
    sub = args.sandbox_command
    if sub == "create":
        meta = {}
        for pair in args.meta:
            k, eq, v = pair.partition("=")
            if not eq or not k:
                print(f"vertal2kubo sandbox create: --meta {pair!r} is not K=V", file=stderr)
                return EXIT_USAGE
            meta[k] = v
        network, problem = _network(args)
        if problem:
            print(f"vertal2kubo sandbox create: {problem}", file=stderr)
            return EXIT_USAGE
        sbx = client.create_sandbox(args.image, args.timeout, metadata=meta, on_timeout=args.on_timeout, network=network)
        print(json.dumps(sbx.info, indent=2) if args.json else sbx.id, file=stdout)
        return 0
    if sub == "ls":
        page = client.list_sandboxes(status=args.status)
        items = [s.info for s in page["sandboxes"]]
        while page["next_cursor"]:
            page = client.list_sandboxes(status=args.status, cursor=page["next_cursor"])
            items += [s.info for s in page["sandboxes"]]
        if args.json:
            print(json.dumps(items, indent=2), file=stdout)
        for s in [] if args.json else items:
            print(f"{s['id']}  {s.get('status', ''):<7}  {s.get('image', '')}  {s.get('expires_at', '')}", file=stdout)
        return 0
    if sub == "exec":
        exit_code = 0
        for event in client.get_sandbox(args.id).commands.stream(" ".join(args.cmd), timeout_s=args.timeout):
            if event["type"] in ("stdout", "stderr"):
                out = stdout if event["type"] == "stdout" else stderr
                out.write(event["text"])
                out.flush()
            elif event["type"] == "result":
                exit_code = event["result"].get("exit_code", 0)
        return exit_code
    if sub == "cp":
        remote_src, remote_dst = _sandbox_path(args.src), _sandbox_path(args.dst)
        if (remote_src is None) == (remote_dst is None):
            print("vertal2kubo sandbox cp: exactly one of SRC and DST is ID:PATH", file=stderr)
            return EXIT_USAGE
        if remote_dst is not None:
            if args.src == "-":
                data = sys.stdin.buffer.read()
            else:
                with open(args.src, "rb") as f:
                    data = f.read()
            info = client.get_sandbox(remote_dst[0]).files.write(remote_dst[1], data)
            print(f"wrote {info.get('path', remote_dst[1])} ({info.get('size', len(data))} bytes)", file=stderr)
            return 0
        data = client.get_sandbox(remote_src[0]).files.read(remote_src[1])
        if args.dst == "-":
            stdout.flush()
            getattr(stdout, "buffer", sys.stdout.buffer).write(data)
        else:
            with open(args.dst, "wb") as f:
                f.write(data)
        return 0
    sbx = client.get_sandbox(args.id)
    sbx = {"pause": sbx.pause, "resume": sbx.resume, "rm": sbx.kill}[sub]()
    print(f"{sbx.id} {sbx.status}", file=stdout)
    return 0


def _sandbox_path(arg: str) -> Optional[tuple]:
    """(id, path) of an ID:PATH argument, None for a local path."""
    sid, colon, path = arg.partition(":")
    if colon and sid.startswith("sbx_") and path:
        return sid, path
    return None


def _report(e: KuboError, command: str, stderr: TextIO) -> int:
    if e.code == "connection_failed":
        print(f"vertal2kubo {command}: {e.message}", file=stderr)
        return EXIT_API_FAILED
    # An error event of a stream has no HTTP status of its own.
    details = [f"HTTP {e.status}"] if e.status else []
    if e.request_id:
        details.append(f"request id {e.request_id}")
    if e.retry_after:
        details.append(f"retry after {e.retry_after:g}s")
    line = f"vertal2kubo {command}: {e.code}: {e.message}"
    if details:
        line += f" ({', '.join(details)})"
    print(line, file=stderr)
    return EXIT_API_FAILED


if __name__ == "__main__":
    sys.exit(main())
