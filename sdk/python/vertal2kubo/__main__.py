"""Command line: ``python -m vertal2kubo run|usage ...``.

The client commands talk to the API. The operator commands (serve,
create-key, ...) belong to the ``vertal`` server binary; they are handed to
it when it is on PATH.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
from typing import Optional, Sequence, TextIO

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
        description="Run CODE (or the file it names, or standard input for -) on a Vertal Run "
        "server. The program's stdout and stderr go to this command's, and the exit status is "
        "the program's; 125 means the API refused the request or could not be reached.")
    run.add_argument("code", metavar="CODE|FILE|-")
    run.add_argument("--language", "-l", help="python, javascript or bash (default: from the file extension, else python)")
    run.add_argument("--timeout", type=float, help="wall-clock limit in seconds (default: the server's, 10)")
    run.add_argument("--stdin", help="text for the program's standard input; - reads this command's stdin")
    run.add_argument("--json", action="store_true", help="print the whole API response as JSON")
    run.add_argument("--idempotency-key", help="retry-safe key: the same key and code return the first result")
    connection(run)

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
    parser = _parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as e:  # argparse printed the problem
        return int(e.code or 0)
    if args.command is None:
        parser.print_help(stderr)
        return EXIT_USAGE
    try:
        client = KuboClient(args.url, args.key)
    except ValueError as e:
        print(f"vertal2kubo {args.command}: {e}", file=stderr)
        return EXIT_USAGE
    if args.command == "run":
        return _run(args, client, stdin, stdout, stderr)
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


def _run(args: argparse.Namespace, client: KuboClient, stdin: TextIO, stdout: TextIO, stderr: TextIO) -> int:
    if args.timeout is not None and args.timeout <= 0:
        print("vertal2kubo run: --timeout must be a positive number of seconds", file=stderr)
        return EXIT_USAGE
    if args.code == "-" and args.stdin == "-":
        print("vertal2kubo run: the code and --stdin cannot both come from standard input", file=stderr)
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
    try:
        result = client.run(code, language=args.language or inferred or "python", timeout_s=timeout,
                            idempotency_key=args.idempotency_key, stdin=program_stdin)
    except KuboError as e:
        return _report(e, "run", stderr)

    status = result.get("status")
    if args.json:
        print(json.dumps(result, indent=2), file=stdout)
    else:
        stdout.write(result.get("stdout", ""))
        stderr.write(result.get("stderr", ""))
        if status == "timed_out":
            print(f"vertal2kubo run: timed out ({result.get('duration_ms', 0) / 1000:g}s, {result.get('id')})", file=stderr)
        elif status == "memory_exceeded":
            print(f"vertal2kubo run: memory limit exceeded ({result.get('id')})", file=stderr)
        elif status == "error":
            print(f"vertal2kubo run: the sandbox failed ({result.get('id')}, request {result.get('request_id')})", file=stderr)
        if result.get("truncated"):
            print("vertal2kubo run: output truncated at the per-stream limit (64 KB)", file=stderr)
    stdout.flush()
    exit_code = result.get("exit_code") or 0
    if status == "succeeded":
        return 0
    return exit_code if 0 < exit_code < 256 else 1


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


def _report(e: KuboError, command: str, stderr: TextIO) -> int:
    if e.status == 0:
        print(f"vertal2kubo {command}: {e.message}", file=stderr)
        return EXIT_API_FAILED
    details = f"HTTP {e.status}"
    if e.request_id:
        details += f", request id {e.request_id}"
    if e.retry_after:
        details += f", retry after {e.retry_after:g}s"
    print(f"vertal2kubo {command}: {e.code}: {e.message} ({details})", file=stderr)
    return EXIT_API_FAILED


if __name__ == "__main__":
    sys.exit(main())
