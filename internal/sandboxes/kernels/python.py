# Vertal Run's Python kernel: one code context of a sandbox (see
# internal/sandboxes/contexts.go). It reads one JSON request per line on a
# private copy of stdin and answers on a private copy of stdout, each
# message one line starting with the marker "\x1evtl:". Everything else
# that reaches fd 1 (a subprocess, a C extension) is the cell's raw
# stdout. Cells share one namespace; the last expression's value is the
# result, as a MIME bundle.
import ast, base64, builtins, io, json, os, signal, sys, threading, traceback, types

_MARK = b"\x1evtl:"
_out = os.dup(1)  # non-inheritable: no subprocess holds the channel
_req = os.fdopen(os.dup(0), "rb", buffering=0)
_null = os.open(os.devnull, os.O_RDONLY)
os.dup2(_null, 0)  # the cell's stdin is empty, as a notebook's is
os.close(_null)
sys.stdin = open(os.devnull)
signal.signal(signal.SIGINT, signal.default_int_handler)


_lock = threading.RLock()
_INT = {signal.SIGINT}
_streams = []


def _send(msg):
    # What the cell printed so far goes first, so the order holds.
    with _lock:
        for st in _streams:
            st.flush()
        _emit(msg)


def _emit(msg):
    # One line per message, whole: threads take turns, and an interrupt
    # waits until the line is written.
    b = _MARK + json.dumps(msg, default=str).encode() + b"\n"
    with _lock:
        old = signal.pthread_sigmask(signal.SIG_BLOCK, _INT)
        try:
            while b:
                b = b[os.write(_out, b):]
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, old)


class _Bytes(io.RawIOBase):
    """sys.stdout.buffer: bytes, decoded as UTF-8 (invalid bytes replaced)."""

    def __init__(self, text):
        self._text = text

    def writable(self):
        return True

    def write(self, b):
        self._text.write(bytes(b).decode("utf-8", "replace"))
        return len(b)


class _Stream(io.TextIOBase):
    encoding = "utf-8"
    errors = "strict"

    def __init__(self, name):
        self.name = name
        self.buffer = _Bytes(self)
        self._buf = []
        self._len = 0
        _streams.append(self)

    def writable(self):
        return True

    def flush(self):
        # Whole lines go out as they end (below), the rest here: before any
        # other message, and at the cell's end.
        with _lock:
            s, self._buf, self._len = "".join(self._buf), [], 0
            for i in range(0, len(s), 65536):
                _emit({"t": self.name, "d": s[i:i + 65536]})

    def write(self, s):
        if not isinstance(s, str):
            raise TypeError("write() argument must be str, not " + type(s).__name__)
        with _lock:
            self._buf.append(s)
            self._len += len(s)
            if "\n" in s or self._len >= 65536:
                self.flush()
        return len(s)

    def isatty(self):
        return False


sys.stdout, sys.stderr = _Stream("stdout"), _Stream("stderr")
sys.__stdout__, sys.__stderr__ = sys.stdout, sys.stderr
_ns = {"__name__": "__main__", "__builtins__": builtins}
_loop = None  # asyncio's, made on the first top-level await (the import costs ~30 ms)
_count = 0


def _bundle(v):
    d = {"text/plain": repr(v)}
    for mime, meth in (("text/html", "_repr_html_"), ("image/png", "_repr_png_"), ("image/svg+xml", "_repr_svg_"),
                       ("text/markdown", "_repr_markdown_"), ("text/latex", "_repr_latex_"), ("application/json", "_repr_json_")):
        f = getattr(v, meth, None)
        if f is None or not callable(f):
            continue
        try:
            r = f()
        except Exception:
            continue
        if r is None:
            continue
        if isinstance(r, tuple) and len(r) == 2:
            r = r[0]  # IPython's (data, metadata)
        if isinstance(r, bytes):
            r = base64.b64encode(r).decode()
        elif mime == "application/json" and not isinstance(r, str):
            try:
                r = json.dumps(r)  # IPython's convention: a dict or a list
            except (TypeError, ValueError):
                continue
        if not isinstance(r, str):
            continue  # a bundle holds strings; anything else is dropped, not the whole result
        d[mime] = r
    return d


def _figures():
    plt = sys.modules.get("matplotlib.pyplot")
    if plt is None:
        return
    try:
        for n in plt.get_fignums():
            buf = io.BytesIO()
            fig = plt.figure(n)
            fig.savefig(buf, format="png", bbox_inches="tight")
            _send({"t": "result", "main": False,
                   "data": {"text/plain": repr(fig), "image/png": base64.b64encode(buf.getvalue()).decode()}})
        plt.close("all")
    except Exception as e:
        _send({"t": "stderr", "d": "vertal: could not render the open figures: %r\n" % (e,)})


def _error(e):
    tb = e.__traceback__
    while tb is not None and tb.tb_frame.f_code.co_filename != "<cell>":
        tb = tb.tb_next  # the kernel's own frames are not the user's
    lines = traceback.format_exception(type(e), e, tb)
    _send({"t": "error", "name": type(e).__name__, "value": str(e), "traceback": "".join(lines)})


def _run(code):
    global _loop
    tree = ast.parse(code, "<cell>", "exec")
    last = None
    if tree.body and isinstance(tree.body[-1], ast.Expr):
        last = ast.Expression(tree.body.pop().value)
    flags = ast.PyCF_ALLOW_TOP_LEVEL_AWAIT
    for node, mode in ((tree, "exec"), (last, "eval")):
        if node is None:
            continue
        r = eval(compile(node, "<cell>", mode, flags=flags), _ns)
        if isinstance(r, types.CoroutineType):
            if _loop is None:
                import asyncio
                _loop = asyncio.new_event_loop()
            r = _loop.run_until_complete(r)
        if mode == "eval" and r is not None:
            _ns["_"] = r
            _send({"t": "result", "main": True, "data": _bundle(r)})


def _cell(req):
    global _count
    _count += 1
    saved = {}
    for k, v in (req.get("env") or {}).items():
        saved[k] = os.environ.get(k)
        os.environ[k] = v
    try:
        try:
            _run(req["code"])
        finally:
            _figures()
    except BaseException as e:  # KeyboardInterrupt and SystemExit too: the context stays
        _error(e)
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        while True:  # the end goes out even when an interrupt lands here
            try:
                _send({"t": "end", "n": req.get("n"), "count": _count})
                break
            except KeyboardInterrupt:
                continue


def _main():
    _send({"t": "ready", "pid": os.getpid()})
    while True:
        try:
            line = _req.readline()
            if not line:
                return
            try:
                req = json.loads(line)
            except ValueError:
                continue  # not a request
            _cell(req)
        except KeyboardInterrupt:
            continue  # an interrupt that came between cells


_main()
