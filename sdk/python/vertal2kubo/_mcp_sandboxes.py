"""The stdio MCP server's tools for sandboxes that stay, as `vertal mcp`
has them (internal/mcpserver/sandboxes.go and cells.go): create_sandbox,
run_command, read_file, write_file, list_files, kill_sandbox,
pause_sandbox, resume_sandbox, and run_code with a sandbox_id.

The tools' definitions are package data (sandbox_tools.json), a copy of
the Go server's golden file, so both servers describe them alike; the
tests of both compare them. Each tool calls the API with the key, so its
plan, quota and metering apply as they do over HTTP.
"""

from __future__ import annotations

import base64
import binascii
import json
import os
from urllib.parse import quote
from typing import Any, Callable, Optional

from .client import KuboClient, KuboError
from .sandbox import Sandbox

HOME = "/home/user"

# How much of a file read_file gives back: an agent's context is no place
# for more.
READ_FILE_CAP = 256 << 10

INSTRUCTIONS = (" With create_sandbox you get a sandbox that stays across calls (files, installed state and processes "
                "persist until it ends): run shell commands in it with run_command, run Python or JavaScript that keeps "
                "its variables from one call to the next with run_code and its sandbox_id, move files with read_file, "
                "write_file and list_files, and end it with kill_sandbox when done.")

CELL_DESCRIPTION = (
    "\n\nKeeping state between calls: pass sandbox_id (from create_sandbox) and the code runs as a cell in an "
    "interpreter that stays in that sandbox, Python or JavaScript (language), instead of a fresh program. Variables, "
    "imports, loaded data and open files are kept from one call to the next, so send only the new step (load a CSV "
    "once, then inspect it, then plot it). The value of the cell's last expression comes back as its result (a pandas "
    "DataFrame also as an HTML table, where the image has pandas), and every matplotlib figure left open comes back as "
    "an image. A cell that times out is interrupted (KeyboardInterrupt) and the state stays. Each language has one "
    "default interpreter per sandbox; context_id picks another one made over the API. With sandbox_id, files, stdin, "
    "args, return_files, image and network do not apply: the sandbox's own files stay in its home directory (use "
    "write_file and read_file).")

_RUN_CELL_EXTRA = ("sandbox_id", "context_id")


def tool_definitions() -> list:
    """The sandbox tools, as the Go server lists them."""
    with open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "sandbox_tools.json"), encoding="utf-8") as f:
        return json.load(f)


def with_cells(run_code: dict) -> None:
    """run_code's definition extended with sandbox_id and context_id (withCells in Go)."""
    run_code["description"] += CELL_DESCRIPTION
    inp = run_code["inputSchema"]["properties"]
    inp["sandbox_id"] = {"type": "string", "description":
                         "A sandbox from create_sandbox (sbx_...): run the code as a cell that keeps state between calls. Optional."}
    inp["context_id"] = {"type": "string", "description":
                         "With sandbox_id: the code context (ctx_...) to run in. Default: the language's default context. Optional."}
    out = run_code["outputSchema"]["properties"]
    out["id"] = {"type": "string", "description": "Execution id (exe_...); for a cell, its code context's id (ctx_...)."}
    out["sandbox_id"] = {"type": "string", "description": "For a cell: its sandbox."}
    out["context_id"] = {"type": "string", "description": "For a cell: the code context that ran it; pass it back to keep using it."}
    out["execution_count"] = {"type": "integer", "description": "For a cell: its number in its context."}
    out["results"] = {"type": "array", "description": "For a cell: its results, MIME bundles without their images (those are in the content).",
                      "items": {"type": "object"}}
    out["error"] = {"type": ["object", "null"], "description": "For a cell: what it raised (name, value, traceback)."}


def offers_sandboxes(client: KuboClient) -> bool:
    """Whether the API has sandboxes that stay: only a 404 on the list says
    no (an older server); any other answer, even an error, says yes, as the
    Go server decides."""
    try:
        client.list_sandboxes(limit=1)
    except KuboError as e:
        return e.status != 404
    return True


NETWORK_HINT = ("The network argument may list only what the plan's egress allowlist covers; leave network out for "
                "the plan's whole list, or pass [] for none.")


# The refusal of a network argument that is not a list (networkListMessage
# in Go).
NETWORK_LIST_MESSAGE = ('network must be a list of rules (strings such as "pypi.org"), [] for no network, or left out '
                        "for the plan's whole list")


def network_hint(e: KuboError, network: Any) -> str:
    """What to do about e, the API's refusal of a call that asked for
    network (networkArg.hint in Go); "" when it asked for none or e is not
    about it."""
    # Only a 403 says the list is wider than the plan; a 400 is a malformed
    # rule, which the plan's list does not explain.
    if network is None or e.status != 403 or not (e.message.startswith("network") or "allows no network" in e.message):
        return ""
    return " " + NETWORK_HINT


def strings_problem(value: Any, name: str) -> Optional[str]:
    """Why value is not a list of strings, or None (run_code's args,
    return_files and network, create_sandbox's network)."""
    if not isinstance(value, list):
        if name == "network":
            return "invalid arguments: " + NETWORK_LIST_MESSAGE
        return f"invalid arguments: {name} must be an array of strings"
    for i, v in enumerate(value):
        if not isinstance(v, str):
            return f"invalid arguments: {name}[{i}] must be a string"
    return None


# The refused connections a command's result names (the newest);
# maxCommandRefusals in Go.
MAX_COMMAND_REFUSALS = 5


def attempt_line(a: dict) -> str:
    """A refused or cut connection as a result names it (attemptLine in Go)."""
    what = "cut" if a.get("allowed") else "refused"
    return f"{what}: {a.get('host', '')}:{a.get('port', 0)} ({a.get('kind', '')}): {a.get('reason', '')}"


class ArgError(Exception):
    """A tool's arguments are wrong; the message is for the agent."""


def result(text: str, structured: Optional[dict] = None, is_error: bool = False, extra: Optional[list] = None) -> dict:
    """A tool result: the text an agent reads, then extra content."""
    out: dict[str, Any] = {"content": [{"type": "text", "text": text}] + (extra or [])}
    if structured is not None:
        out["structuredContent"] = structured
    if is_error:
        out["isError"] = True
    return out


def stream_text(s: str) -> str:
    if not s:
        return "(empty)\n"
    return s if s.endswith("\n") else s + "\n"


def _clip(s: str, n: int) -> str:
    return s if len(s) <= n else s[:n] + "..."


class _Args:
    """A tool's arguments, checked as the Go server's decodeArgs does:
    unknown names refused, each value of the type its schema gives."""

    def __init__(self, raw: Any, fields: dict):
        if raw is None:
            raw = {}
        if not isinstance(raw, dict):
            raise ArgError("invalid arguments: the arguments must be an object")
        unknown = sorted(set(raw) - set(fields))
        if unknown:
            raise ArgError(f'invalid arguments: unknown field "{unknown[0]}"')
        self.values: dict[str, Any] = {}
        for name, kind in fields.items():
            v = raw.get(name)
            if v is None:
                continue
            if kind == "str" and not isinstance(v, str):
                raise ArgError(f"invalid arguments: {name} must be a string")
            if kind == "int" and (isinstance(v, bool) or not isinstance(v, int)):
                if isinstance(v, float) and v.is_integer():
                    v = int(v)
                else:
                    raise ArgError(f"invalid arguments: {name} must be an integer")
            if kind == "strmap":
                if not isinstance(v, dict):
                    raise ArgError(f"invalid arguments: {name} must be an object of strings")
                for k, x in v.items():
                    if not isinstance(x, str):
                        raise ArgError(f"invalid arguments: {name}[{json.dumps(_clip(k, 40))}] must be a string")
            if kind == "files" and not isinstance(v, list):
                raise ArgError(f"invalid arguments: {name} must be an array of objects")
            if kind == "strlist":
                problem = strings_problem(v, name)
                if problem:
                    raise ArgError(problem)
            self.values[name] = v

    def get(self, name: str, default: Any = None) -> Any:
        return self.values.get(name, default)

    def required(self, *names: str) -> None:
        for name in names:
            if not self.values.get(name):
                raise ArgError(f"argument {name} is required and must not be empty")


def decode_content(content: str, encoding: str, arg: str) -> bytes:
    if encoding in ("", "utf8"):
        return content.encode("utf-8")
    if encoding == "base64":
        s = content.replace("\r", "").replace("\n", "")
        try:
            data = base64.b64decode(s, validate=True)
        except (ValueError, binascii.Error):
            data = None
        if data is None or base64.b64encode(data).decode("ascii") != s:
            raise ArgError(f"argument {arg} is not valid base64")
        return data
    raise ArgError(f"argument {arg} encoding must be utf8 or base64, not {json.dumps(_clip(encoding, 20))}")


def _structured(record: dict) -> dict:
    """An API record as structured content: a field the API sends as null
    is left out (as the Go server omits it), so the tool's output schema,
    which gives each field one type, holds. metadata may be null."""
    return {k: v for k, v in record.items() if v is not None or k == "metadata"}


def _sandbox_text(info: dict, created: bool) -> str:
    lines = [f"sandbox_id: {info.get('id', '')}", f"status: {info.get('status', '')}"]
    for key in ("reason", "message"):
        if info.get(key):
            lines.append(f"{key}: {info[key]}")
    if info.get("image"):
        build = f" (build {info['image_version']})" if info.get("image_version") else ""
        lines.append(f"image: {info['image']}{build}")
    if info.get("status") != "ended" and info.get("expires_at"):
        lines.append(f"expires_at: {info['expires_at']} (on_timeout {info.get('on_timeout') or 'kill'})")
    if info.get("status") != "ended":
        line = _sandbox_network_line(info, created)
        if line:
            lines.append(line)
    if created:
        lines.append(f"home: {HOME}")
        lines.append("note: pass sandbox_id to run_command, read_file, write_file and list_files; call kill_sandbox when done")
    return "\n".join(lines) + "\n"


def _sandbox_network_line(info: dict, created: bool) -> str:
    """What the sandbox may reach and, while it runs, what it reached
    (sandboxNetworkText in Go); "network: none" for a new one without."""
    n = (info.get("limits") or {}).get("network") or {}
    if not n.get("allow"):
        return "network: none" if created else ""
    line = "network: allowed " + ", ".join(n["allow"])
    if n.get("max_bytes"):
        line += f" (at most {n['max_bytes']} bytes in all)"
    u = info.get("network")
    if isinstance(u, dict):
        line += (f"; connections: {u.get('connections', 0)} made, {u.get('refused', 0)} refused; "
                 f"bytes: {u.get('bytes_in', 0)} in, {u.get('bytes_out', 0)} out")
    return line


def _valid_prefix(data: bytes) -> Optional[str]:
    """data as text when it is UTF-8 but for a character cut at its end."""
    for cut in range(0, 4):
        try:
            return data[:len(data) - cut].decode("utf-8")
        except UnicodeDecodeError:
            continue
    return None


class SandboxTools:
    """The handlers; error_text renders an API refusal as the server's
    other tools do."""

    def __init__(self, client: KuboClient, error_text: Callable[[KuboError], str]):
        self.client = client
        self._error_text = error_text

    def error(self, e: KuboError) -> dict:
        return result(self._error_text(e), is_error=True)

    def _sandbox(self, sandbox_id: str) -> Sandbox:
        return Sandbox(self.client, {"id": sandbox_id})

    def _refused_so_far(self, sid: str) -> Optional[int]:
        """How many connections sandbox sid has had refused so far; None
        when it has no network or its record cannot be read (watchRefused
        in Go)."""
        try:
            info = self._sandbox(sid).refresh().info
        except KuboError:
            return None
        if not ((info.get("limits") or {}).get("network") or {}).get("allow"):
            return None
        return int((info.get("network") or {}).get("refused") or 0)

    def _refused_text(self, sid: str, before: Optional[int]) -> str:
        """The connections refused since _refused_so_far, each with why, the
        newest MAX_COMMAND_REFUSALS only; "" when there were none."""
        if before is None:
            return ""
        try:
            usage = self._sandbox(sid).refresh().info.get("network")
        except KuboError:
            return ""
        if not isinstance(usage, dict) or int(usage.get("refused") or 0) <= before:
            return ""
        n = int(usage["refused"]) - before
        refused = [a for a in usage.get("attempts") or [] if isinstance(a, dict) and not a.get("allowed")]
        # Attempts are oldest first; the record keeps only the newest.
        refused = refused[max(0, len(refused) - min(n, MAX_COMMAND_REFUSALS)):]
        text = f"network: {n} connection(s) refused while it ran"
        if len(refused) < n:
            text += f"; the newest {len(refused)}:"
        return text + "\n" + "".join(attempt_line(a) + "\n" for a in refused)

    def handlers(self) -> dict:
        return {
            "create_sandbox": self.create_sandbox,
            "run_command": self.run_command,
            "read_file": self.read_file,
            "write_file": self.write_file,
            "list_files": self.list_files,
            "kill_sandbox": lambda a: self._call(a, Sandbox.kill),
            "pause_sandbox": lambda a: self._call(a, Sandbox.pause),
            "resume_sandbox": lambda a: self._call(a, Sandbox.resume),
        }

    def call(self, name: str, args: Any) -> dict:
        try:
            return self.handlers()[name](args)
        except ArgError as e:
            return result(str(e), is_error=True)
        except KuboError as e:
            return self.error(e)

    def create_sandbox(self, raw: Any) -> dict:
        a = _Args(raw, {"image": "str", "timeout_s": "int", "on_timeout": "str", "env": "strmap",
                        "metadata": "strmap", "files": "files", "network": "strlist"})
        timeout, on_timeout = a.get("timeout_s"), a.get("on_timeout") or ""
        if timeout is not None and timeout < 1:
            raise ArgError("argument timeout_s must be at least 1")
        if on_timeout not in ("", "kill", "pause"):
            raise ArgError(f"argument on_timeout must be kill or pause, not {json.dumps(_clip(on_timeout, 20))}")
        files = []
        for i, f in enumerate(a.get("files") or []):
            if not isinstance(f, dict):
                raise ArgError(f"invalid arguments: files[{i}] must be an object")
            unknown = sorted(set(f) - {"path", "content", "encoding"})
            if unknown:
                raise ArgError(f'invalid arguments: unknown field "{unknown[0]}" in files[{i}]')
            for field in ("path", "content", "encoding"):
                if f.get(field) is not None and not isinstance(f[field], str):
                    raise ArgError(f"invalid arguments: files[{i}].{field} must be a string")
            if not f.get("path"):
                raise ArgError(f"argument files[{i}].path is required")
            files.append((f["path"], decode_content(f.get("content") or "", f.get("encoding") or "",
                                                    f"files[{i}].content")))
        # network: None (left out or null) is the plan's list, [] none.
        network = a.get("network")
        try:
            sbx = self.client.create_sandbox(a.get("image") or None, timeout, env=a.get("env"), metadata=a.get("metadata"),
                                             files=files or None, on_timeout=on_timeout or None, network=network)
        except KuboError as e:
            return result(self._error_text(e) + network_hint(e, network), is_error=True)
        return result(_sandbox_text(sbx.info, True), structured=_structured(sbx.info))

    def _call(self, raw: Any, method: Callable[[Sandbox], Sandbox]) -> dict:
        a = _Args(raw, {"sandbox_id": "str"})
        a.required("sandbox_id")
        sbx = method(self._sandbox(a.get("sandbox_id")))
        return result(_sandbox_text(sbx.info, False), structured=_structured(sbx.info))

    def run_command(self, raw: Any) -> dict:
        a = _Args(raw, {"sandbox_id": "str", "cmd": "str", "cwd": "str", "env": "strmap", "stdin": "str",
                        "timeout_s": "int"})
        a.required("sandbox_id", "cmd")
        timeout = a.get("timeout_s")
        if timeout is not None and timeout < 1:
            raise ArgError("argument timeout_s must be at least 1")
        sid = a.get("sandbox_id")
        before = self._refused_so_far(sid)
        out = self._sandbox(sid).commands.run(a.get("cmd"), cwd=a.get("cwd") or None, env=a.get("env") or None,
                                               stdin=a.get("stdin") or None, timeout_s=timeout)
        status = out.get("status", "")
        lines = [f"status: {status}", f"exit_code: {out.get('exit_code', 0)}", f"duration_ms: {out.get('duration_ms', 0)}"]
        if out.get("truncated"):
            lines.append("truncated: true (output over the plan's limit per stream was cut)")
        note = {"timed_out": "the command was killed when timeout_s ran out; the sandbox is still there",
                "memory_exceeded": "the command was killed for using more memory than the plan allows"}.get(status)
        if note:
            lines.append("note: " + note)
        lines.append(f"sandbox_id: {sid}")
        text = "\n".join(lines) + "\n" + self._refused_text(sid, before) + "--- stdout ---\n" + stream_text(out.get("stdout", "")) + \
            "--- stderr ---\n" + stream_text(out.get("stderr", ""))
        structured = {k: out[k] for k in ("pid", "status", "stdout", "stderr", "exit_code", "duration_ms", "truncated",
                                          "cpu_seconds") if out.get(k) is not None}
        cpu = (out.get("usage") or {}).get("cpu_seconds")
        if "cpu_seconds" not in structured and cpu is not None:
            structured["cpu_seconds"] = cpu  # the wire nests it under usage; the Go server's tool puts it on top
        return result(text, structured=structured, is_error=status != "succeeded")

    def read_file(self, raw: Any) -> dict:
        a = _Args(raw, {"sandbox_id": "str", "path": "str"})
        a.required("sandbox_id", "path")
        path = a.get("path")
        try:
            whole = self._sandbox(a.get("sandbox_id")).files.read(path)
        except IsADirectoryError:
            raise ArgError(f"{path} is a directory; use list_files") from None
        data = whole[:READ_FILE_CAP]
        truncated = len(whole) > len(data)
        encoding = "utf8"
        content = _valid_prefix(data) if truncated else None
        if content is None:
            try:
                content = data.decode("utf-8")
            except UnicodeDecodeError:
                encoding, content = "base64", base64.b64encode(data).decode("ascii")
        notes = []
        if encoding == "base64":
            notes.append("note: the file is not UTF-8 text; its content above is base64-encoded")
        if truncated:
            notes.append(f"note: the file has {len(whole)} bytes; only the first {len(data)} are shown "
                         "(read the rest with run_command, e.g. tail or sed)")
        extra = [{"type": "text", "text": "\n".join(notes)}] if notes else None
        return result(content, structured={"path": path, "size": len(whole), "encoding": encoding, "content": content,
                                            "truncated": truncated}, extra=extra)

    def write_file(self, raw: Any) -> dict:
        a = _Args(raw, {"sandbox_id": "str", "path": "str", "content": "str", "encoding": "str"})
        a.required("sandbox_id", "path")
        if a.get("content") is None:
            # An empty file is fine; a forgotten content is not.
            raise ArgError('argument content is required ("" for an empty file)')
        data = decode_content(a.get("content"), a.get("encoding") or "", "content")
        fi = self._sandbox(a.get("sandbox_id")).files.write(a.get("path"), data)
        return result(f"wrote {fi.get('path')} ({fi.get('size', 0)} bytes, mode {fi.get('mode', '')})\n", structured=_structured(fi))

    def list_files(self, raw: Any) -> dict:
        a = _Args(raw, {"sandbox_id": "str", "path": "str"})
        a.required("sandbox_id")
        path = a.get("path") or HOME
        try:
            files = self._sandbox(a.get("sandbox_id")).files.list(path)
        except NotADirectoryError:
            raise ArgError(f"{path} is a file, not a directory; use read_file") from None
        lines = [f"{path}: {len(files)} entries"]
        for f in files:
            name = f.get("name", "") + ("/" if f.get("type") == "dir" else "")
            lines.append(f"{f.get('type', ''):<7} {f.get('mode', '')} {f.get('size', 0):>10} {f.get('mtime', '')} {name}")
        return result("\n".join(lines) + "\n", structured={"files": [_structured(f) for f in files]})

    def run_cell(self, checked: dict, raw: dict) -> dict:
        """run_code with a sandbox_id: a cell in a code context that keeps
        its state (runCell in Go)."""
        sid, cid = raw.get("sandbox_id") or "", raw.get("context_id") or ""
        for name in _RUN_CELL_EXTRA:
            if raw.get(name) is not None and not isinstance(raw[name], str):
                return result(f"invalid arguments: {name} must be a string", is_error=True)
        if not sid:
            return result("argument context_id needs sandbox_id, the sandbox the context is in", is_error=True)
        if any(raw.get(k) for k in ("image", "stdin", "files", "args", "return_files")) or raw.get("network") is not None:
            return result("with sandbox_id, the arguments image, stdin, files, args, return_files and network do not "
                          "apply: the sandbox keeps its own files (use write_file and read_file) and its own network",
                          is_error=True)
        timeout = checked.get("timeout_s")
        before = self._refused_so_far(sid)
        try:
            out = self._sandbox(sid).run_code(checked["code"], context_id=cid or None, language=checked["language"],
                                              env=checked.get("env"), timeout_s=int(timeout) if timeout else None)
        except KuboError as e:
            return self.error(e)
        status, context_id = out.get("status", ""), out.get("context_id", "")
        lines = [f"status: {status}", f"sandbox_id: {sid}", f"context_id: {context_id}",
                 f"execution_count: {out.get('execution_count', 0)}", f"duration_ms: {out.get('duration_ms', 0)}"]
        if out.get("truncated"):
            lines.append("truncated: true (output over the plan's limit, or results over 16 MiB, were cut)")
        if status == "timed_out":
            lines.append("note: the cell was interrupted when timeout_s ran out")
        text = "\n".join(lines) + "\n" + self._refused_text(sid, before) + "--- stdout ---\n" + stream_text(out.get("stdout", "")) + \
            "--- stderr ---\n" + stream_text(out.get("stderr", ""))
        content: list = []
        results = []
        for i, o in enumerate(out.get("results") or []):
            if not isinstance(o, dict):
                continue
            data = o.get("data") if isinstance(o.get("data"), dict) else {}
            results.append({m: v for m, v in data.items() if not m.startswith("image/") or m == "image/svg+xml"})
            if o.get("main"):
                text += f"--- result ---\n{data.get('text/plain', '')}\n"
            png = data.get("image/png")
            if isinstance(png, str) and png:
                try:
                    ok = base64.b64decode(png, validate=True)
                except (ValueError, binascii.Error):
                    ok = b""
                if ok:
                    content.append({"type": "image", "mimeType": "image/png", "data": base64.b64encode(ok).decode("ascii")})
                    if not o.get("main"):
                        text += f"--- figure {i + 1}: image below ---\n"
            html = data.get("text/html")
            if isinstance(html, str) and html:
                uri = (f"vertal://sandboxes/{quote(sid, safe='$&+:=@')}/contexts/{quote(context_id, safe='$&+:=@')}"
                       f"/results/{i + 1}.html")
                content.append({"type": "resource", "resource": {"uri": uri, "mimeType": "text/html", "text": html}})
        err = out.get("error")
        cell_err = None
        if isinstance(err, dict):
            text += f"--- error: {err.get('name', '')} ---\n{(err.get('traceback') or '').rstrip(chr(10))}\n"
            if err.get("name") in ("ContextRestarted", "ContextDied"):
                text += "note: the interpreter was restarted and its state is lost: define again what later cells need\n"
            cell_err = {"name": err.get("name", ""), "value": err.get("value", ""), "traceback": err.get("traceback", "")}
        structured = {"id": context_id, "status": status, "stdout": out.get("stdout", ""), "stderr": out.get("stderr", ""),
                      "exit_code": 0 if status == "succeeded" else 1, "duration_ms": out.get("duration_ms", 0),
                      "truncated": bool(out.get("truncated")), "sandbox_id": sid, "context_id": context_id,
                      "execution_count": out.get("execution_count", 0), "results": results, "error": cell_err}
        return result(text, structured=structured, is_error=status != "succeeded", extra=content)
