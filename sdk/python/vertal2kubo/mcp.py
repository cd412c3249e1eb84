"""MCP server for AI agents on stdio: ``python -m vertal2kubo.mcp``.

It speaks JSON-RPC 2.0, one message per line, and offers the same tools as
``vertal mcp``: run_code and get_usage, and, when the API has sandboxes that
stay, create_sandbox, run_command, read_file, write_file, list_files,
kill_sandbox, pause_sandbox and resume_sandbox, with run_code taking a
sandbox_id to run cells that keep their state. The tools call the Vertal Run API
at KUBO_API_URL with KUBO_API_KEY, so the key's quota, rate limit and
metering apply. Nothing but the standard library is used.

Client configuration (Claude Desktop, Claude Code and others)::

    {"mcpServers": {"vertal-run": {
        "command": "python", "args": ["-m", "vertal2kubo.mcp"],
        "env": {"KUBO_API_URL": "https://vertalrun.com/api", "KUBO_API_KEY": "kubo_sk_..."}}}}
"""

from __future__ import annotations

import base64
import binascii
import json
import sys
import threading
import urllib.parse
from typing import Any, Callable, Optional, TextIO

from . import __version__
from . import _mcp_sandboxes as sandboxes
from ._sniff import detect_content_type
from .client import KuboClient, KuboError

# Newest first. The server answers with the client's version when it knows
# it, else with the newest.
PROTOCOL_VERSIONS = ("2025-11-25", "2025-06-18", "2025-03-26", "2024-11-05")

DEFAULT_LANGUAGES = [{"name": "python"}, {"name": "javascript"}, {"name": "bash"}]

INSTRUCTIONS = ("Vertal Run executes Python, JavaScript and Bash in a fresh isolated sandbox per call "
                "(no network unless the plan allows hosts, no package installs). Use run_code to run a complete "
                "program and get_usage to see the remaining daily quota and plan limits.")

GET_USAGE_DESCRIPTION = (
    "Show today's usage of this Vertal Run API key (executions and sandbox seconds in the current "
    "UTC day) and the plan's limits: executions per day, requests per minute and the maximum "
    "timeout_s for run_code. Use it to choose timeout_s, or after run_code reports quota_exceeded "
    "or rate_limited. It does not run code and does not count toward the quota.")

# What an agent should do about an API refusal (same as the Go server).
HINTS = {
    "quota_exceeded": "The daily execution quota of this API key is used up; it resets at 00:00 UTC. Retrying today will fail.",
    "rate_limited": "Too many requests this minute; wait before calling again.",
    "overloaded": "Every sandbox is busy right now; try again in a few seconds.",
    "unauthorized": "The API key (KUBO_API_KEY or the Authorization header) is missing, invalid or revoked.",
    "invalid_timeout": "timeout_s must be between 1 and the plan's max_timeout_s; call get_usage to see it.",
    "sandbox_not_running": "The sandbox has ended (killed, expired or failed) and keeps nothing; call create_sandbox for a new one.",
    "sandbox_limit": "This key has as many sandboxes as its plan allows; kill_sandbox one you no longer need, then try again.",
}

# JSON-RPC error codes.
PARSE_ERROR, INVALID_REQUEST, METHOD_NOT_FOUND, INVALID_PARAMS = -32700, -32600, -32601, -32602


def _language_label(lang: dict) -> str:
    name, version = lang.get("name", ""), lang.get("version") or ""
    if name == "javascript":
        return f"javascript (Node.js {version})" if version else "javascript (Node.js)"
    return f"{name} {version}" if version else name


def _images_paragraph(images: Optional[list]) -> str:
    """The images an agent may choose and what each adds; "" when only the
    default image (standard libraries) is known. As imagesParagraph in Go."""
    if not images or len(images) == 1 and not images[0].get("packages"):
        return ""
    parts = []
    for img in images:
        pkgs = img.get("packages") or []
        if not pkgs:
            parts.append(img["name"] + " (standard libraries only)")
            continue
        parts.append(img["name"] + " (" + ", ".join((p["name"] + " " + (p.get("version") or "")).strip() for p in pkgs) + ")")
    return ("\n\nImages, chosen with the image argument (default: default): " + "; ".join(parts) +
            ". Debian (apt) packages are Python modules: python3-pandas is import pandas; npm packages load with require().")


def describe_run_code(languages: list, images: Optional[list] = None) -> str:
    """The run_code description; keep it in step with the Go server's."""
    labels = ", ".join(_language_label(l) for l in (languages or DEFAULT_LANGUAGES))
    return (
        "Run a complete program in a fresh, isolated Vertal Run sandbox and get back its stdout, "
        "stderr, exit code and duration.\n\n"
        f"Languages: {labels}. Only each language's standard library is available, unless the image adds packages."
        f"{_images_paragraph(images)}\n\n"
        "What the sandbox cannot do: it has no network access (no HTTP requests, no downloads) "
        "beyond the hosts its plan allows (see Network), "
        "packages cannot be installed (pip, npm and apt do not work; the root filesystem is "
        "read-only), and nothing persists between calls, so every call must contain the whole "
        "program, including imports and data.\n\n"
        "What it can do: read standard input (the stdin argument), write files in its working "
        "directory /code and under /tmp (each its own space of at least 16 MB, 1 MB per file; nothing "
        "written can be executed), and use 1 CPU and up to 64 processes or threads. Memory is capped "
        "per plan (memory_mb in get_usage).\n\n"
        "Files, environment and arguments: the program runs in the working directory /code. Give it "
        "input files with files (paths relative to /code, content as text or base64), environment "
        "variables with env and command-line arguments with args (sys.argv[1:], "
        "process.argv.slice(2), $1...). To get back files the program writes in /code, list globs in "
        "return_files (\"*.png\", \"out/**\"): images come back as image content, any other file as "
        "an embedded resource. The number and total size of files in and out are capped per plan.\n\n"
        "Network: the program may reach only the hosts on the egress allowlist of this API key's plan, and "
        "the built-in plans list none. Where the plan lists some, the network argument narrows them for one "
        "call ([] for none); asking for a host the plan does not list is refused, with the plan's list in the "
        "message. A run with a network reports the bytes it carried and each connection refused, with why, "
        "so a failed fetch says whether the sandbox let it out.\n\n"
        "Limits: the program is killed when timeout_s runs out (10 seconds unless you ask for more, "
        "up to the plan's max_timeout_s shown by get_usage). Output is kept up to 64 KB per stream; "
        "beyond that it is cut and truncated is true, so print summaries rather than huge data.\n\n"
        "A program that fails, times out or runs out of memory comes back as an error result that "
        "still carries its status, output and exit code: read stderr, fix the code and call again. "
        "Every call counts once toward the daily quota.")


# The most rules an allowlist holds (egress.MaxRules in Go).
MAX_NETWORK_RULES = 64

# run_code's network in its output (networkSchema in Go).
_COUNT = {"type": "integer", "minimum": 0}
_NETWORK_SCHEMA = {
    "type": "object",
    "description": "Only for a run with a network: its allowlist, the bytes its connections carried, the connections "
                   "made and refused, and the newest attempts, each refused or cut one with its reason.",
    "properties": {
        "allow": {"type": "array", "items": {"type": "string"}},
        "bytes_in": _COUNT, "bytes_out": _COUNT, "connections": _COUNT, "refused": _COUNT,
        "attempts": {"type": "array", "items": {"type": "object", "properties": {
            "host": {"type": "string"},
            "port": {"type": "integer"},
            "kind": {"type": "string", "description": "http or tls."},
            "allowed": {"type": "boolean"},
            "reason": {"type": "string", "description": "Why it was refused or cut."}}}},
    },
}


def tool_definitions(languages: list, images: Optional[list] = None, with_sandboxes: bool = False) -> list:
    """tools/list result, sorted by name like the Go server's; with_sandboxes
    adds the sandbox tools and run_code's sandbox_id and context_id."""
    names = ", ".join(l["name"] for l in (languages or DEFAULT_LANGUAGES))
    run_code = {
        "name": "run_code",
        "title": "Run code in a sandbox",
        "description": describe_run_code(languages, images),
        "annotations": {"title": "Run code in a sandbox", "readOnlyHint": False, "idempotentHint": False,
                        "destructiveHint": False, "openWorldHint": False},
        "inputSchema": {
            "type": "object",
            "properties": {
                "image": {"type": "string", "description": "Image to run on, by name. Default: default. Other images add "
                          "packages, listed in this description when the server has any. Optional."},
                "language": {"type": "string", "description": f"Programming language: {names}."},
                "code": {"type": "string", "description": "The complete program to run. Print what you want to see to stdout."},
                "timeout_s": {"type": "number", "minimum": 1, "description":
                              "Wall-clock limit in seconds, from 1 to the plan's max_timeout_s (see get_usage). "
                              "Default 10, or the plan's maximum if lower."},
                "stdin": {"type": "string", "description": "Text given to the program on standard input. Optional."},
                "files": {"type": "array", "description": "Files placed in the working directory (/code) before the program runs. Optional.",
                          "items": {
                              "type": "object",
                              "properties": {
                                  "path": {"type": "string", "description":
                                           "Relative path with / separators, e.g. data/input.csv; no .. and no leading /."},
                                  "content": {"type": "string", "description": "The file's content: text, or base64 when encoding is base64."},
                                  "encoding": {"type": "string", "enum": ["utf8", "base64"], "default": "utf8", "description":
                                               "utf8 (the default) for text, base64 (standard, padded) for binary content."},
                              },
                              "required": ["path", "content"],
                              "additionalProperties": False,
                          }},
                "env": {"type": "object", "additionalProperties": {"type": "string"}, "description":
                        "Environment variables for the program. Names match [A-Za-z_][A-Za-z0-9_]*; PATH, HOME, LANG, PWD, "
                        "NODE_OPTIONS and VERTAL_* cannot be set. Optional."},
                "args": {"type": "array", "items": {"type": "string"}, "description":
                         "Command-line arguments after the program file (sys.argv[1:], process.argv.slice(2), $1...). Optional."},
                "return_files": {"type": "array", "items": {"type": "string"}, "maxItems": 20, "description":
                                 "Globs relative to /code of files to send back after the run, e.g. [\"*.png\", \"out/**\"]. "
                                 "Images come back as image content, other files as embedded resources. Optional."},
                "network": {"type": "array", "items": {"type": "string"}, "maxItems": MAX_NETWORK_RULES, "description":
                            "What the program may reach, within the plan's egress allowlist: host names (pypi.org), "
                            "*.suffix wildcards (*.pythonhosted.org) and address ranges (203.0.113.0/24). Left out: "
                            "the plan's whole list (none on the built-in plans); []: no network. The network is HTTP "
                            "and HTTPS only, through a proxy that HTTP_PROXY and HTTPS_PROXY name (ports 80 and 443), "
                            "so ssh, git:// and other raw connections do not get out. "
                            "Optional."},
            },
            "required": ["language", "code"],
            "additionalProperties": False,
        },
        "outputSchema": {
            "type": "object",
            "properties": {
                "id": {"type": "string", "description": "Execution id (exe_...)."},
                "status": {"type": "string", "enum": ["succeeded", "failed", "timed_out", "memory_exceeded", "error", "canceled"],
                           "description": "succeeded means the program exited with code 0."},
                "stdout": {"type": "string"},
                "stderr": {"type": "string"},
                "exit_code": {"type": "integer"},
                "duration_ms": {"type": "integer"},
                "truncated": {"type": "boolean", "description": "True if a stream went over 64 KB and was cut."},
                "usage": {"type": "object", "properties": {
                    "sandbox_seconds": {"type": "number"},
                    "network_bytes_in": {"type": "integer", "description": "Only with a network: bytes carried to the sandbox."},
                    "network_bytes_out": {"type": "integer", "description": "Only with a network: bytes carried from the sandbox."}}},
                "request_id": {"type": "string"},
                "image": {"type": ["string", "null"], "description": "The image the code ran on (default when none was named)."},
                "image_version": {"type": ["string", "null"],
                                  "description": "The id of that image's build (GET /v1/images shows it as version); null when unknown. "
                                                 "Two runs with the same id had the same packages."},
                "files": {"type": "array", "description": "Files matched by return_files (their content is in the result's content).",
                          "items": {"type": "object", "properties": {"path": {"type": "string"}, "size": {"type": "integer"}}}},
                "files_truncated": {"type": "boolean", "description": "True if the plan's caps left some matching files out."},
                "network": _NETWORK_SCHEMA,
            },
            "required": ["id", "status", "stdout", "stderr", "exit_code", "duration_ms", "truncated"],
        },
    }
    get_usage = {
        "name": "get_usage",
        "title": "Usage and plan limits",
        "description": GET_USAGE_DESCRIPTION,
        "annotations": {"title": "Usage and plan limits", "readOnlyHint": True, "idempotentHint": True,
                        "openWorldHint": False},
        "inputSchema": {"type": "object", "properties": {}, "additionalProperties": False},
        "outputSchema": {
            "type": "object",
            "properties": {
                "tenant": {"type": "string"},
                "plan": {"type": "string"},
                "today": {"type": "object", "properties": {
                    "executions": {"type": "integer"}, "sandbox_seconds": {"type": "number"}}},
                "limits": {"type": "object", "properties": {
                    "executions_per_day": {"type": "integer"}, "requests_per_minute": {"type": "integer"},
                    "max_timeout_s": {"type": "integer"}, "memory_mb": {"type": "integer"}}},
            },
            "required": ["tenant", "plan", "today", "limits"],
        },
    }
    if not with_sandboxes:
        return [get_usage, run_code]
    sandboxes.with_cells(run_code)
    return sorted([get_usage, run_code] + sandboxes.tool_definitions(), key=lambda t: t["name"])


def _text_result(text: str, is_error: bool = False, structured: Optional[dict] = None) -> dict:
    return sandboxes.result(text, structured=structured, is_error=is_error)


_stream = sandboxes.stream_text


def format_execution(ex: dict, files: str = "") -> str:
    """A result for a model to read; files is the line naming the returned
    files, or ""."""
    status = ex.get("status", "")
    lines = [f"status: {status}", f"exit_code: {ex.get('exit_code', 0)}", f"duration_ms: {ex.get('duration_ms', 0)}"]
    if ex.get("truncated"):
        lines.append("truncated: true (output over 64 KB per stream was cut)")
    note = {"timed_out": "the program was killed when timeout_s ran out",
            "memory_exceeded": "the program was killed for using more memory than the plan allows",
            "error": "the sandbox failed, not the program; try again"}.get(status)
    if note:
        lines.append("note: " + note)
    # Which build ran it: the packages an agent saw differ across builds.
    if ex.get("image"):
        build = f" (build {ex['image_version']})" if ex.get("image_version") else ""
        lines.append(f"image: {ex['image']}{build}")
    lines.append(f"execution_id: {ex.get('id', '')}")
    return "\n".join(lines) + "\n" + files + network_text(ex.get("network")) + \
        "--- stdout ---\n" + _stream(ex.get("stdout", "")) + "--- stderr ---\n" + _stream(ex.get("stderr", ""))


# The refused or cut attempts the text names; the structured content has
# them all.
_MAX_NETWORK_LINES = 10


def network_text(network: Any) -> str:
    """What a run with a network reached, for a model to read: its
    allowlist, traffic, and each refused or cut connection with why
    (networkText in Go); "" without a network."""
    if not isinstance(network, dict):
        return ""
    allow = ", ".join(network.get("allow") or []) or "(none)"
    text = (f"network: allowed {allow}; connections: {network.get('connections', 0)} made, "
            f"{network.get('refused', 0)} refused; bytes: {network.get('bytes_in', 0)} in, {network.get('bytes_out', 0)} out\n")
    # The same refusal repeated (a client retrying) is one line.
    times: dict = {}
    for a in network.get("attempts") or []:
        if not isinstance(a, dict) or (a.get("allowed") and not a.get("reason")):
            continue
        line = sandboxes.attempt_line(a)
        times[line] = times.get(line, 0) + 1
    for i, (line, n) in enumerate(times.items()):
        if i == _MAX_NETWORK_LINES:
            text += f"({len(times) - i} more refused or cut connections in the structured content)\n"
            break
        text += line + (f" ({n} times)" if n > 1 else "") + "\n"
    return text


def _error_text(err: KuboError) -> str:
    if err.status == 0 and err.code == "invalid_response":
        return f"The Vertal Run API sent an answer this server could not read: {err.message}"
    if err.status == 0:
        return f"Could not reach the Vertal Run API (check KUBO_API_URL): {err.message}"
    text = f"Vertal Run API error {err.code}: {err.message} (HTTP {err.status}"
    if err.request_id:
        text += f", request id {err.request_id}"
    text += ")."
    if err.retry_after:
        text += f" Retry after {err.retry_after:g}s."
    if err.code in HINTS:
        text += " " + HINTS[err.code]
    return text


_RUN_FIELDS = ("image", "language", "code", "timeout_s", "stdin", "files", "env", "args", "return_files",
               "network", "sandbox_id", "context_id")
_FILE_FIELDS = ("path", "content", "encoding")


def _clip(s: str, n: int) -> str:
    """s shortened for echoing client input in a message."""
    return s if len(s.encode("utf-8")) <= n else s.encode("utf-8")[:n].decode("utf-8", "ignore") + "..."


def _check_files(files: Any) -> tuple[list, Optional[str]]:
    """run_code's files as (path, bytes) pairs for the client. Only what the
    schema fixes is checked; paths and sizes are the API's to refuse, with
    its own messages."""
    if not isinstance(files, list):
        return [], "invalid arguments: files must be an array of objects"
    out = []
    for i, f in enumerate(files):
        if not isinstance(f, dict):
            return [], f"invalid arguments: files[{i}] must be an object"
        unknown = sorted(set(f) - set(_FILE_FIELDS))
        if unknown:
            return [], f'invalid arguments: unknown field "{unknown[0]}" in files[{i}]'
        for field in _FILE_FIELDS:
            if field in f and f[field] is not None and not isinstance(f[field], str):
                return [], f"invalid arguments: files[{i}].{field} must be a string"
        path, content, encoding = f.get("path") or "", f.get("content") or "", f.get("encoding") or ""
        if path == "":
            return [], f"argument files[{i}].path is required"
        if encoding not in ("", "utf8", "base64"):
            return [], f"argument files[{i}].encoding must be utf8 or base64, not {json.dumps(_clip(encoding, 20))}"
        if encoding == "base64":
            data = _strict_base64(content)
            if data is None:
                return [], f"files[{i}].content is not valid base64"
        else:
            data = content.encode("utf-8")
        out.append((path, data))
    return out, None


def _strict_base64(s: str) -> Optional[bytes]:
    """Standard, padded base64 as Go's StdEncoding.Strict() reads it (line
    breaks ignored, padding required, unused bits zero), or None."""
    s = s.replace("\r", "").replace("\n", "")
    try:
        data = base64.b64decode(s, validate=True)
    except (ValueError, binascii.Error):
        return None
    return data if base64.b64encode(data).decode("ascii") == s else None


def _check_run_args(args: Any) -> tuple[Optional[dict], Optional[str]]:
    if not isinstance(args, dict):
        return None, "arguments language and code are required"
    unknown = sorted(set(args) - set(_RUN_FIELDS))
    if unknown:
        return None, f'invalid arguments: unknown field "{unknown[0]}"'
    language, code = args.get("language"), args.get("code")
    timeout, stdin = args.get("timeout_s"), args.get("stdin")
    if not isinstance(language, str) or not language.strip():
        return None, "argument language is required (python, javascript or bash)"
    if not isinstance(code, str) or code == "":
        return None, "argument code is required and must not be empty"
    if timeout is not None and (isinstance(timeout, bool) or not isinstance(timeout, (int, float))):
        return None, "argument timeout_s must be a number of seconds"
    if timeout is not None and timeout < 1:
        return None, "argument timeout_s must be at least 1"
    if stdin is not None and not isinstance(stdin, str):
        return None, "argument stdin must be a string"
    checked = {"language": language, "code": code, "timeout_s": timeout, "stdin": stdin}
    image = args.get("image")
    if image is not None:
        if not isinstance(image, str):
            return None, "argument image must be a string"
        checked["image"] = image or None
    env = args.get("env")
    if env is not None:
        if not isinstance(env, dict):
            return None, "invalid arguments: env must be an object of strings"
        for k, v in env.items():
            if not isinstance(v, str):
                return None, f"invalid arguments: env[{json.dumps(_clip(k, 40))}] must be a string"
        checked["env"] = env
    for name in ("args", "return_files", "network"):
        if args.get(name) is not None:
            problem = sandboxes.strings_problem(args[name], name)
            if problem:
                return None, problem
            checked[name] = args[name]
    if args.get("files") is not None:
        files, problem = _check_files(args["files"])
        if problem:
            return None, problem
        checked["files"] = files
    return checked, None


# The image types an MCP client can show. SVG is not one of them: it is
# markup (and can carry script), so it comes back as a text resource.
RASTER_IMAGES = frozenset({"image/png", "image/jpeg", "image/gif", "image/webp"})


def file_uri(execution_id: str, path: str) -> str:
    """A returned file's name as an MCP resource; each part escaped as Go's
    url.PathEscape does."""
    def esc(s: str) -> str:
        return urllib.parse.quote(s, safe="$&+:=@")
    return f"vertal://executions/{esc(execution_id)}/files/" + "/".join(esc(p) for p in path.split("/"))


def file_content(execution_id: str, path: str, data: bytes) -> dict:
    """A returned file as MCP content. The type is sniffed from the bytes,
    never taken from the name: a program names its files as it likes.
    Raster images become image content; anything else an embedded
    resource, as text when it is valid UTF-8 and as a blob otherwise."""
    sniffed = detect_content_type(data)
    if sniffed in RASTER_IMAGES:
        return {"type": "image", "mimeType": sniffed, "data": base64.b64encode(data).decode("ascii")}
    resource: dict[str, Any] = {"uri": file_uri(execution_id, path)}
    try:
        text = bytes(data).decode("utf-8")
    except UnicodeDecodeError:
        resource["mimeType"] = sniffed
        resource["blob"] = base64.b64encode(data).decode("ascii")
    else:
        resource["mimeType"] = sniffed if sniffed.startswith("text/") else "text/plain; charset=utf-8"
        resource["text"] = text
    return {"type": "resource", "resource": resource}


def files_line(files: list, truncated: bool) -> str:
    """The line naming the returned files for the text a model reads."""
    if not files and not truncated:
        return ""
    names = [f"{f.get('path')} ({f.get('size', 0)} bytes)" for f in files]
    line = "files: " + (", ".join(names) if names else "(none)")
    if truncated:
        line += "; files_truncated: true (the plan's caps on count or size left some matching files out)"
    return line + "\n"


def _structured(ex: dict) -> dict:
    """The execution without the files' bytes: they are in the content, once."""
    if not isinstance(ex.get("files"), list):
        return ex
    files = [{k: v for k, v in f.items() if k not in ("content", "encoding")} if isinstance(f, dict) else f
             for f in ex["files"]]
    return dict(ex, files=files)


class Server:
    """The stdio MCP server. ``client`` is a KuboClient (or None when it
    could not be configured: then every tool call explains why)."""

    def __init__(self, client: Optional[KuboClient], languages: Optional[list] = None,
                 config_error: Optional[str] = None, log: Callable[[str], None] = lambda m: None,
                 images: Optional[list] = None, with_sandboxes: bool = False):
        self.client = client
        self.config_error = config_error
        self.tools = tool_definitions(languages or [], images, with_sandboxes and client is not None)
        self.sandboxes = sandboxes.SandboxTools(client, _error_text) if with_sandboxes and client is not None else None
        self.instructions = INSTRUCTIONS + (sandboxes.INSTRUCTIONS if self.sandboxes else "")
        self.log = log
        self._write_lock = threading.Lock()
        self._out: Optional[TextIO] = None

    # -- tools -------------------------------------------------------------

    def run_code(self, args: Any) -> dict:
        checked, problem = _check_run_args(args)
        if problem:
            return _text_result(problem, is_error=True)
        if self.client is None:
            return _text_result(self.config_error or "the server is not configured", is_error=True)
        if args.get("sandbox_id") or args.get("context_id"):
            if self.sandboxes is None:
                return _text_result("This server does not offer sandboxes that stay; use run_code without sandbox_id.",
                                    is_error=True)
            return self.sandboxes.run_cell(checked, args)
        try:
            ex = self.client.run(checked["code"], language=checked["language"], timeout_s=checked["timeout_s"],
                                 stdin=checked["stdin"], files=checked.get("files"), env=checked.get("env"),
                                 args=checked.get("args"), return_files=checked.get("return_files"),
                                 image=checked.get("image"), network=checked.get("network"))
        except KuboError as e:
            return _text_result(_error_text(e) + sandboxes.network_hint(e, checked.get("network")), is_error=True)
        files = [f for f in ex.get("files") or [] if isinstance(f, dict)]
        text = format_execution(ex, files_line(files, bool(ex.get("files_truncated"))))
        # A program that did not succeed is a tool error the agent should
        # read and react to, not a protocol failure.
        result = _text_result(text, is_error=ex.get("status") != "succeeded", structured=_structured(ex))
        result["content"] += [file_content(ex.get("id", ""), f.get("path", ""), f.get("content") or b"") for f in files]
        return result

    def get_usage(self, args: Any) -> dict:
        if args not in (None, {}):
            return _text_result("get_usage takes no arguments", is_error=True)
        if self.client is None:
            return _text_result(self.config_error or "the server is not configured", is_error=True)
        try:
            u = self.client.usage()
        except KuboError as e:
            return _text_result(_error_text(e), is_error=True)
        today = u.get("today", {})
        text = (f"tenant: {u.get('tenant')}\nplan: {u.get('plan')}\n"
                f"today (UTC): {today.get('executions', 0)} executions, {today.get('sandbox_seconds', 0):.3f} sandbox seconds\n")
        if isinstance(u.get("limits"), dict):
            text += "limits: " + json.dumps(u["limits"], separators=(",", ":"), sort_keys=True) + "\n"
        return _text_result(text, structured=u)

    # -- JSON-RPC ------------------------------------------------------------

    def handle(self, msg: Any) -> Optional[dict]:
        """Answer one message; None for notifications and responses."""
        if not isinstance(msg, dict) or msg.get("jsonrpc") != "2.0":
            return _error(None, INVALID_REQUEST, "not a JSON-RPC 2.0 message")
        if "method" not in msg:
            return None  # a response to a request we never send
        method, params = msg["method"], msg.get("params") or {}
        is_request = "id" in msg
        msg_id = msg.get("id")
        if not is_request:
            return None  # notifications/initialized, notifications/cancelled, ...
        if not isinstance(params, dict):
            return _error(msg_id, INVALID_PARAMS, "params must be an object")
        if method == "initialize":
            wanted = params.get("protocolVersion")
            version = wanted if wanted in PROTOCOL_VERSIONS else PROTOCOL_VERSIONS[0]
            return _result(msg_id, {
                "protocolVersion": version,
                # The same as the Go server's: tools, whose list never changes.
                "capabilities": {"tools": {}},
                "serverInfo": {"name": "vertal-run", "title": "Vertal Run", "version": __version__},
                "instructions": self.instructions,
            })
        if method == "ping":
            return _result(msg_id, {})
        if method == "tools/list":
            return _result(msg_id, {"tools": self.tools})
        if method == "tools/call":
            name, args = params.get("name"), params.get("arguments")
            if name == "run_code":
                return _result(msg_id, self.run_code(args if args is not None else {}))
            if name == "get_usage":
                return _result(msg_id, self.get_usage(args if args is not None else {}))
            if self.sandboxes is not None and name in self.sandboxes.handlers():
                return _result(msg_id, self.sandboxes.call(name, args))
            return _error(msg_id, INVALID_PARAMS, f"unknown tool {name!r}")
        return _error(msg_id, METHOD_NOT_FOUND, f"method {method!r} not found")

    def _send(self, reply: Optional[dict]) -> None:
        if reply is None or self._out is None:
            return
        line = json.dumps(reply, ensure_ascii=False, separators=(",", ":"))
        with self._write_lock:
            try:
                self._out.write(line + "\n")
                self._out.flush()
            except (BrokenPipeError, ValueError):
                pass  # the client went away; serve() ends when stdin does

    def _dispatch(self, msg: Any) -> None:
        try:
            reply = self.handle(msg)
        except Exception as e:  # never let one message kill the server
            self.log(f"vertal2kubo.mcp: internal error: {type(e).__name__}: {e}")
            reply = _error(msg.get("id") if isinstance(msg, dict) else None, -32603, "internal error")
        self._send(reply)

    def serve(self, inp: TextIO, out: TextIO) -> None:
        """Serve until inp ends. Tool calls run on their own threads so a
        long execution does not hold up pings or other calls."""
        self._out = out
        workers = []
        for line in inp:
            line = line.strip()
            if not line:
                continue
            try:
                msg = json.loads(line)
            except ValueError:
                self._send(_error(None, PARSE_ERROR, "invalid JSON"))
                continue
            if isinstance(msg, list):  # batches (protocol 2025-03-26)
                for m in msg:
                    self._dispatch(m)
                continue
            if isinstance(msg, dict) and msg.get("method") == "tools/call" and "id" in msg:
                t = threading.Thread(target=self._dispatch, args=(msg,), daemon=True)
                t.start()
                workers.append(t)
                workers = [w for w in workers if w.is_alive()]
            else:
                self._dispatch(msg)
        for t in workers:
            t.join()


def _result(msg_id: Any, result: dict) -> dict:
    return {"jsonrpc": "2.0", "id": msg_id, "result": result}


def _error(msg_id: Any, code: int, message: str) -> dict:
    return {"jsonrpc": "2.0", "id": msg_id, "error": {"code": code, "message": message}}


def main() -> int:
    def log(m: str) -> None:
        print(m, file=sys.stderr, flush=True)

    try:
        client = KuboClient()
    except ValueError as e:
        # Fail at start, like `vertal mcp`: the MCP client shows this.
        log(f"vertal2kubo.mcp: {e}")
        return 2
    # The versions make the description more useful; without them the
    # tools still work.
    languages = None
    quick = KuboClient(client.url, client.api_key, max_retries=0, timeout=5)
    try:
        languages = quick.languages()
    except KuboError as e:
        log(f"vertal2kubo.mcp: could not list languages ({e}); describing run_code without versions")
    images = None
    try:
        images = quick.images()
    except KuboError:
        pass  # an older server: run_code is described without images
    with_sandboxes = sandboxes.offers_sandboxes(quick)
    if not with_sandboxes:
        log("vertal2kubo.mcp: the server does not offer sandboxes; serving run_code and get_usage only")
    stdin = open(sys.stdin.fileno(), encoding="utf-8", errors="replace", closefd=False)
    stdout = open(sys.stdout.fileno(), "w", encoding="utf-8", closefd=False)
    Server(client, languages, log=log, images=images, with_sandboxes=with_sandboxes).serve(stdin, stdout)
    return 0


if __name__ == "__main__":
    sys.exit(main())
