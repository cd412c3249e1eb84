// Vertal Run playground.
//
// Program output is untrusted: it only ever reaches the page through
// textContent (the page's Content-Security-Policy enforces Trusted Types, so
// an innerHTML assignment would throw). Returned files are never parsed:
// raster images (sniffed from their bytes) are shown through blob: URLs in
// <img>, everything else is only offered as a download. The API key lives
// in sessionStorage for this tab only and is sent only in the Authorization
// header, which is why output is streamed with fetch and not EventSource.
'use strict';

(function () {
  const C = window.VertalCommon;
  const { sseParser, readEvents, readJSON, networkError, outputNodes, imageType, fromBase64, toBase64,
    formatMs, formatBytes, el, safeStorage, validKeyChars } = C;
  const $ = (id) => document.getElementById(id);
  const apiBase = document.body.dataset.apiBase || '';
  const { authFor, api } = C.apiClient(apiBase, () => session);
  const serverURL = location.origin + apiBase;
  const store = safeStorage();

  const STARTERS = {
    python: [
      'import platform',
      'import statistics',
      '',
      'print(f"Hello from Python {platform.python_version()}")',
      '',
      'temperatures = [21.5, 23.1, 19.8, 25.4, 22.0]',
      'mean = statistics.mean(temperatures)',
      'print(f"mean {mean:.1f} °C, max {max(temperatures)} °C")',
      '',
      'for n in range(1, 6):',
      '    print(n, "squared is", n * n)',
      '',
    ].join('\n'),
    javascript: [
      'console.log(`Hello from Node ${process.version}`);',
      '',
      'const words = ["every", "run", "gets", "a", "fresh", "sandbox"];',
      'console.log(words.map((w) => w.toUpperCase()).join(" "));',
      '',
      'const total = [1, 2, 3, 4, 5].reduce((sum, n) => sum + n * n, 0);',
      'console.log("sum of squares:", total);',
      '',
    ].join('\n'),
    bash: [
      'echo "Hello from Bash ${BASH_VERSION}"',
      'echo "running as uid $(id -u)"',
      '',
      'for fruit in apple banana cherry; do',
      '  printf "%-8s %d letters\\n" "$fruit" "${#fruit}"',
      'done',
      '',
    ].join('\n'),
  };
  const LABELS = { python: 'Python', javascript: 'JavaScript', bash: 'Bash' };
  const INDENT = { python: '    ', javascript: '  ', bash: '  ' };

  const els = {
    key: $('key'), keyToggle: $('key-toggle'), keyForget: $('key-forget'), keyStatus: $('key-status'),
    language: $('language'), image: $('image'), timeout: $('timeout'), stdinToggle: $('stdin-toggle'), stdinWrap: $('stdin-wrap'),
    stdin: $('stdin'), code: $('code'), run: $('run'), runShortcut: $('run-shortcut'),
    status: $('status'), exitCode: $('exit-code'), duration: $('duration'), sandboxSeconds: $('sandbox-seconds'),
    truncated: $('truncated'), error: $('error'), errorStatus: $('error-status'), errorCode: $('error-code'),
    errorMessage: $('error-message'), errorHint: $('error-hint'), stdout: $('stdout'), stderr: $('stderr'),
    executionId: $('execution-id'), requestId: $('request-id'), panel: $('snippet-panel'),
    files: $('files'), attached: $('attached'), filesClear: $('files-clear'), returnFiles: $('return-files'),
    returned: $('returned'), returnedNote: $('returned-note'), returnedList: $('returned-list'), returnedImages: $('returned-images'),
  };

  // ---- state -------------------------------------------------------------

  let language = store.get('vertal.language');
  if (!STARTERS[language]) language = 'python';
  const buffers = {};
  for (const name of Object.keys(STARTERS)) {
    const saved = store.get('vertal.code.' + name);
    buffers[name] = saved === null ? STARTERS[name] : saved;
  }
  let running = false;
  let activeTab = 'curl';

  els.language.value = language;
  els.code.value = buffers[language];
  els.key.value = store.get('vertal.apiKey') || '';
  if (/Mac|iPhone|iPad/.test(navigator.platform || navigator.userAgent)) {
    els.runShortcut.textContent = '⌘ ⏎';
  }

  // ---- API key -----------------------------------------------------------

  function currentKey() {
    return els.key.value.trim();
  }

  // A signed-in browser runs without a key (see VertalCommon.apiClient).
  // A pasted key still wins.
  let session = null;
  async function loadSession() {
    const body = await C.loadSession();
    if (!body) return;
    session = body;
    if (!currentKey()) {
      setKeyStatus('Signed in as ' + body.email + ': runs count to your account, no key needed.', 'ok');
      checkKey();
    }
  }

  function setKeyStatus(text, kind) {
    els.keyStatus.textContent = text;
    els.keyStatus.classList.toggle('ok', kind === 'ok');
    els.keyStatus.classList.toggle('bad', kind === 'bad');
  }

  const KEY_HINT = 'Kept only in this browser tab and sent only to this server.';

  // checkKey shows who the key belongs to (GET /v1/usage) and the runtime
  // versions (GET /v1/languages). It is only a convenience: Run works
  // without it.
  let keyCheck = 0;
  async function checkKey() {
    const key = currentKey();
    const mine = ++keyCheck;
    if (!key && !session) {
      setKeyStatus(KEY_HINT, '');
      return;
    }
    if (key && !validKeyChars(key)) {
      setKeyStatus('This key contains spaces or characters a key never has.', 'bad');
      return;
    }
    if (key) setKeyStatus('Checking the key…', '');
    const usage = await api('GET', '/v1/usage', key);
    if (mine !== keyCheck) return;
    if (usage.ok && usage.data) {
      showUsage(usage.data);
      loadLanguages(key);
      loadImages(key);
    } else if (usage.error) {
      setKeyStatus(usage.error.code + ': ' + usage.error.message, 'bad');
    }
  }

  let usageState = null;
  function showUsage(u) {
    usageState = u;
    const today = u.today || {};
    const limits = u.limits || {};
    const who = (!currentKey() && session) ? 'Signed in as ' + session.email + ', no key needed' : 'Key OK';
    let text = who + ' · ' + (u.tenant || 'tenant') + ' · ' + (u.plan || '?') + ' plan';
    if (typeof today.executions === 'number') {
      text += ' · ' + today.executions;
      if (typeof limits.executions_per_day === 'number') text += ' of ' + limits.executions_per_day;
      text += ' runs today (UTC)';
    }
    setKeyStatus(text, 'ok');
    if (typeof limits.max_timeout_s === 'number') {
      els.timeout.max = String(limits.max_timeout_s);
      els.timeout.title = 'Seconds, 1 to ' + limits.max_timeout_s + ' on your plan';
    }
  }

  async function loadLanguages(key) {
    const res = await api('GET', '/v1/languages', key);
    if (!res.ok || !res.data) return;
    const list = Array.isArray(res.data) ? res.data : res.data.languages;
    if (!Array.isArray(list)) return;
    for (const lang of list) {
      if (!lang || typeof lang.name !== 'string') continue;
      const option = Array.from(els.language.options).find((o) => o.value === lang.name);
      if (option && typeof lang.version === 'string' && lang.version) {
        option.textContent = (LABELS[lang.name] || lang.name) + ' ' + lang.version;
      }
    }
  }

  // The image picker shows only when the key may use more than the
  // default image; each option names the image's main packages.
  async function loadImages(key) {
    const res = await api('GET', '/v1/images', key);
    if (!res.ok || !res.data || !Array.isArray(res.data.images)) return;
    const list = res.data.images.filter((img) => img && typeof img.name === 'string');
    const saved = store.get('vertal.image') || 'default';
    els.image.replaceChildren();
    for (const img of list) {
      const option = document.createElement('option');
      option.value = img.name;
      const pkgs = Array.isArray(img.packages) ? img.packages.map((p) => p && p.name).filter((n) => typeof n === 'string') : [];
      option.textContent = img.name;
      option.title = pkgs.length ? pkgs.join(', ') : 'standard libraries only';
      els.image.appendChild(option);
    }
    els.image.value = list.some((img) => img.name === saved) ? saved : 'default';
    els.image.hidden = list.length < 2;
  }

  let keyTimer = 0;
  els.key.addEventListener('input', () => {
    const key = currentKey();
    if (key) store.set('vertal.apiKey', key);
    else store.remove('vertal.apiKey');
    clearTimeout(keyTimer);
    keyTimer = setTimeout(checkKey, 600);
  });
  els.key.addEventListener('keydown', (e) => {
    if (e.key === 'Enter' && !(e.ctrlKey || e.metaKey)) {
      e.preventDefault();
      clearTimeout(keyTimer);
      checkKey();
      els.code.focus();
    }
  });
  C.bindKeyToggle(els.key, els.keyToggle);
  els.keyForget.addEventListener('click', () => {
    els.key.value = '';
    store.remove('vertal.apiKey');
    usageState = null;
    keyCheck++;
    setKeyStatus('Key forgotten. ' + KEY_HINT, '');
    els.key.focus();
  });

  // ---- editor ------------------------------------------------------------

  els.image.addEventListener('change', () => store.set('vertal.image', els.image.value));
  els.language.addEventListener('change', () => {
    buffers[language] = els.code.value;
    language = els.language.value;
    els.code.value = buffers[language];
    store.set('vertal.language', language);
    updateSnippets();
  });

  let saveTimer = 0;
  els.code.addEventListener('input', () => {
    buffers[language] = els.code.value;
    clearTimeout(saveTimer);
    saveTimer = setTimeout(() => {
      store.set('vertal.code.' + language, buffers[language]);
      updateSnippets();
    }, 250);
  });

  // Tab indents inside the editor; Esc then Tab leaves it, so keyboard
  // users are never trapped.
  let escapeArmed = false;
  els.code.addEventListener('keydown', (e) => {
    if (e.key === 'Escape') {
      escapeArmed = true;
      return;
    }
    const armed = escapeArmed;
    escapeArmed = false;
    if (e.key === 'Tab' && !armed && !e.ctrlKey && !e.metaKey && !e.altKey) {
      e.preventDefault();
      if (e.shiftKey) outdent(); else indent();
    } else if (e.key === 'Enter' && !e.ctrlKey && !e.metaKey && !e.shiftKey && !e.altKey && !e.isComposing) {
      e.preventDefault();
      newlineKeepingIndent();
    }
  });

  function insertText(text) {
    const ta = els.code;
    ta.focus();
    // execCommand keeps the browser's undo history; setRangeText is the fallback.
    if (!document.execCommand || !document.execCommand('insertText', false, text)) {
      const start = ta.selectionStart;
      ta.setRangeText(text, start, ta.selectionEnd, 'end');
      ta.dispatchEvent(new Event('input'));
    }
  }

  function lineRange() {
    const ta = els.code;
    const v = ta.value;
    const start = v.lastIndexOf('\n', ta.selectionStart - 1) + 1;
    let end = ta.selectionEnd;
    if (end > ta.selectionStart && v[end - 1] === '\n') end--;
    const next = v.indexOf('\n', end);
    return { start, end: next === -1 ? v.length : next };
  }

  function indent() {
    const ta = els.code;
    const unit = INDENT[language];
    if (ta.value.slice(ta.selectionStart, ta.selectionEnd).indexOf('\n') === -1) {
      insertText(unit);
      return;
    }
    const r = lineRange();
    const lines = ta.value.slice(r.start, r.end).split('\n');
    ta.setSelectionRange(r.start, r.end);
    insertText(lines.map((l) => (l ? unit + l : l)).join('\n'));
    ta.setSelectionRange(r.start, r.start + lines.map((l) => (l ? unit + l : l)).join('\n').length);
  }

  function outdent() {
    const ta = els.code;
    const unit = INDENT[language];
    const r = lineRange();
    const block = ta.value.slice(r.start, r.end);
    const out = block.split('\n').map((l) => {
      if (l.startsWith(unit)) return l.slice(unit.length);
      if (l.startsWith('\t')) return l.slice(1);
      return l.replace(/^ +/, '');
    }).join('\n');
    if (out === block) return;
    ta.setSelectionRange(r.start, r.end);
    insertText(out);
    ta.setSelectionRange(r.start, r.start + out.length);
  }

  function newlineKeepingIndent() {
    const ta = els.code;
    const v = ta.value;
    const lineStart = v.lastIndexOf('\n', ta.selectionStart - 1) + 1;
    const before = v.slice(lineStart, ta.selectionStart);
    let lead = (before.match(/^[ \t]*/) || [''])[0];
    const trimmed = before.trimEnd();
    const opens = language === 'python' ? /:$/ : language === 'javascript' ? /[{[(]$/ : /(\bthen|\bdo|\{)$/;
    if (opens.test(trimmed)) lead += INDENT[language];
    insertText('\n' + lead);
  }

  els.stdinToggle.addEventListener('click', () => {
    const open = els.stdinWrap.hidden;
    els.stdinWrap.hidden = !open;
    els.stdinToggle.setAttribute('aria-expanded', String(open));
    els.stdinToggle.classList.toggle('on', open);
    if (open) els.stdin.focus();
    updateSnippets();
  });
  els.stdin.addEventListener('input', debounce(updateSnippets, 250));
  els.returnFiles.addEventListener('input', debounce(updateSnippets, 250));

  // ---- files in ----------------------------------------------------------

  let attached = [];
  const ATTACHED_NONE = els.attached.textContent;
  els.files.addEventListener('change', () => {
    attached = Array.from(els.files.files || []);
    showAttached();
  });
  els.filesClear.addEventListener('click', () => {
    attached = [];
    els.files.value = '';
    showAttached();
  });

  function showAttached() {
    els.attached.textContent = attached.length === 0 ? ATTACHED_NONE
      : attached.map((f) => f.name + ' (' + formatBytes(f.size) + ')').join(', ');
    els.filesClear.hidden = attached.length === 0;
  }

  // encodeFiles reads the attached files as the request's files: base64,
  // named as picked (a browser gives no directories).
  async function encodeFiles() {
    const out = [];
    for (const f of attached) {
      out.push({ path: f.name, content: toBase64(new Uint8Array(await f.arrayBuffer())), encoding: 'base64' });
    }
    return out;
  }

  function returnGlobs() {
    return els.returnFiles.value.split(/[\s,]+/).filter((g) => g !== '');
  }
  els.timeout.addEventListener('input', debounce(updateSnippets, 250));

  // Ctrl+Enter (⌘+Enter on a Mac) runs from anywhere on the page.
  document.addEventListener('keydown', (e) => {
    if (e.key === 'Enter' && (e.ctrlKey || e.metaKey) && !e.altKey) {
      e.preventDefault();
      run();
    }
  });
  els.run.addEventListener('click', run);

  // ---- running -----------------------------------------------------------

  function request() {
    const body = { language: language, code: els.code.value };
    if (!els.image.hidden && els.image.value && els.image.value !== 'default') body.image = els.image.value;
    const t = els.timeout.value.trim();
    if (t !== '') body.timeout_s = Number(t);
    if (!els.stdinWrap.hidden && els.stdin.value !== '') body.stdin = els.stdin.value;
    const globs = returnGlobs();
    if (globs.length > 0) body.return_files = globs;
    return body;
  }

  async function run() {
    if (running) return;
    const key = currentKey();
    if (!key && !session) {
      showError({ status: 0, code: 'missing_key', message: 'Paste an API key first. It starts with kubo_sk_.' },
        'vertal serve --dev prints one on first start; operators create keys with vertal create-key.');
      // The focus goes to the key field, so say it there too: on a phone
      // the result card is a screen further down.
      setKeyStatus('Paste an API key first. It starts with kubo_sk_.', 'bad');
      els.key.focus();
      return;
    }
    if (key && !validKeyChars(key)) {
      showError({ status: 0, code: 'invalid_key', message: 'The key contains spaces or characters a key never has.' });
      setKeyStatus('The key contains spaces or characters a key never has.', 'bad');
      els.key.focus();
      return;
    }
    const body = request();
    if (body.timeout_s !== undefined && !Number.isInteger(body.timeout_s)) {
      showError({ status: 0, code: 'invalid_timeout', message: 'The timeout must be a whole number of seconds.' });
      els.timeout.focus();
      return;
    }
    setRunning(true);
    clearResult();
    setBadge('running…', 'running');
    let res;
    try {
      if (attached.length > 0) body.files = await encodeFiles();
      res = await execute(key, body);
    } catch (e) {
      res = { ok: false, status: 0, error: { status: 0, code: 'file_error', message: 'Could not read an attached file (' + (e && e.message ? e.message : 'error') + ').', retryAfter: null } };
    }
    setRunning(false);
    if (res.ok && res.data && typeof res.data.status === 'string') {
      showResult(res.data, res.requestId);
      if (usageState && usageState.today && typeof usageState.today.executions === 'number' && !res.data.idempotent_replay) {
        usageState.today.executions++;
        showUsage(usageState);
      }
      return;
    }
    const err = res.error || { status: res.status, code: 'unexpected_response', message: 'The server sent a response the playground does not understand.' };
    showError(err, hintFor(err));
    if (err.status === 401) setKeyStatus(err.code + ': ' + err.message, 'bad');
  }

  function setRunning(on) {
    running = on;
    els.run.disabled = on;
    els.run.setAttribute('aria-busy', String(on));
  }

  function clearResult() {
    els.error.hidden = true;
    for (const el of [els.exitCode, els.duration, els.sandboxSeconds, els.truncated, els.executionId, els.requestId]) {
      el.textContent = '—';
      el.classList.remove('warn');
    }
    setOutput(els.stdout, '');
    setOutput(els.stderr, '');
    clearFiles();
  }

  function setBadge(text, kind) {
    els.status.textContent = text;
    els.status.className = 'badge badge-' + kind;
  }

  function showResult(r, headerRequestId) {
    setBadge(String(r.status) + (r.idempotent_replay ? ' (replay)' : ''), /^[a-z_]+$/.test(r.status) ? r.status : 'error');
    els.exitCode.textContent = r.exit_code === null || r.exit_code === undefined ? '—' : String(r.exit_code);
    els.duration.textContent = typeof r.duration_ms === 'number' ? formatMs(r.duration_ms) : '—';
    const sec = r.usage && typeof r.usage.sandbox_seconds === 'number' ? r.usage.sandbox_seconds : null;
    els.sandboxSeconds.textContent = sec === null ? '—' : sec.toFixed(3) + ' s';
    els.truncated.textContent = r.truncated ? 'yes' : 'no';
    els.truncated.classList.toggle('warn', !!r.truncated);
    setOutput(els.stdout, typeof r.stdout === 'string' ? r.stdout : '');
    setOutput(els.stderr, typeof r.stderr === 'string' ? r.stderr : '');
    els.executionId.textContent = typeof r.id === 'string' ? r.id : '—';
    els.requestId.textContent = r.request_id || headerRequestId || '—';
    showFiles(Array.isArray(r.files) ? r.files : [], !!r.files_truncated);
  }

  // ---- files out ---------------------------------------------------------

  let blobURLs = [];
  function clearFiles() {
    for (const u of blobURLs) URL.revokeObjectURL(u);
    blobURLs = [];
    els.returnedList.replaceChildren();
    els.returnedImages.replaceChildren();
    els.returnedNote.hidden = true;
    els.returned.hidden = true;
  }

  function showFiles(files, truncated) {
    clearFiles();
    if (files.length === 0 && !truncated) return;
    for (const f of files) {
      if (!f || typeof f.path !== 'string' || typeof f.content !== 'string') continue;
      let bytes;
      try {
        bytes = f.encoding === 'base64' ? fromBase64(f.content) : new TextEncoder().encode(f.content);
      } catch (e) {
        continue;
      }
      const type = imageType(bytes);
      // Anything not an image is a download only: as octet-stream, a
      // blob: URL opened by hand cannot render as a page of this origin.
      const url = URL.createObjectURL(new Blob([bytes], { type: type || 'application/octet-stream' }));
      blobURLs.push(url);
      const name = f.path.split('/').pop() || 'file';
      const link = el('a', { href: url, download: name }, [f.path]);
      els.returnedList.append(el('li', {}, [link, el('span', { class: 'size' }, [formatBytes(bytes.length)])]));
      if (type) {
        const img = el('img', { src: url, alt: f.path });
        els.returnedImages.append(el('figure', {}, [img, el('figcaption', {}, [f.path])]));
      }
    }
    if (truncated) {
      els.returnedNote.textContent = 'Some matching files were left out: the plan caps how many files and bytes come back.';
      els.returnedNote.hidden = false;
    }
    els.returned.hidden = false;
  }

  // setOutput shows untrusted program output as text. Control characters
  // (ANSI escapes, bells, backspaces, lone carriage returns) are drawn as
  // marked escapes like \x1b, so they can neither style the page nor hide
  // text. Every piece goes in through a text node; nothing is parsed.
  function setOutput(el, s) {
    el.replaceChildren(...outputNodes(s));
    el.classList.toggle('empty', s === '');
  }

  // appendOutput adds a chunk that arrived while the program runs; the
  // result replaces it all with the stored output at the end.
  function appendOutput(el, s) {
    if (s === '') return;
    el.append(...outputNodes(s));
    el.classList.remove('empty');
  }

  function showError(err, hint) {
    setBadge(err.status ? 'HTTP ' + err.status : 'not sent', err.status ? 'http' : 'error');
    els.errorStatus.textContent = err.status ? String(err.status) : '';
    els.errorCode.textContent = err.code || 'error';
    els.errorMessage.textContent = err.message || '';
    els.errorHint.textContent = hint || '';
    els.errorHint.hidden = !hint;
    els.error.hidden = false;
    els.requestId.textContent = err.requestId || '—';
  }

  function hintFor(err) {
    const wait = err.retryAfter;
    switch (err.code) {
      case 'unauthorized':
        return 'Check the key: it must be an active key for this server. vertal serve --dev prints one; operators create keys with vertal create-key.';
      case 'quota_exceeded':
        if (wait === null) return 'The daily quota resets at 00:00 UTC.';
        return 'The daily quota resets in ' + formatWait(wait) + ', at ' + formatClock(wait) + ' your time (00:00 UTC).';
      case 'rate_limited':
        return wait === null ? 'Too many requests this minute; wait a moment.' : 'Too many requests this minute. Try again in ' + formatWait(wait) + '.';
      case 'overloaded':
        return wait === null ? 'Every sandbox is busy; try again shortly.' : 'Every sandbox is busy. Try again in ' + formatWait(wait) + '.';
      case 'network_error':
        return 'Is the server still running? The playground talks to ' + serverURL + '.';
    }
    if (err.status === 413) return 'The code, input or attached files are larger than the server accepts.';
    if (err.code === 'stream_ended') return 'The run goes on without the page and its result is stored; GET ' + apiBase + '/v1/executions/{id} shows it.';
    return '';
  }

  // execute runs body with live output: POST with Accept: text/event-stream,
  // reading the Server-Sent Events from the response body as they come
  // (stdout and stderr chunks, then the result). A response that is not an
  // event stream (an error decided before the run, or a server without
  // streaming) is read as the plain JSON call's. It resolves like api().
  async function execute(key, body) {
    let resp;
    try {
      const auth = authFor(key);
      resp = await fetch(apiBase + '/v1/executions', {
        method: 'POST',
        headers: Object.assign({ Accept: 'text/event-stream', 'Content-Type': 'application/json' }, auth.headers),
        body: JSON.stringify(body),
        cache: 'no-store',
        credentials: auth.credentials,
      });
    } catch (e) {
      return networkError(e);
    }
    const type = (resp.headers.get('Content-Type') || '').split(';')[0].trim().toLowerCase();
    if (!resp.ok || type !== 'text/event-stream' || !resp.body) return readJSON(resp);
    const requestId = resp.headers.get('X-Request-ID') || '';
    let outcome = null;
    let execId = '';
    const parser = sseParser((ev) => {
      let data = null;
      try {
        data = JSON.parse(ev.data);
      } catch (e) {
        return; // not ours to show
      }
      if (!data || typeof data !== 'object') return;
      switch (ev.event) {
        case 'started':
          if (typeof data.id === 'string') {
            execId = data.id;
            els.executionId.textContent = data.id;
          }
          break;
        case 'stdout':
        case 'stderr':
          if (typeof data.text === 'string') appendOutput(ev.event === 'stdout' ? els.stdout : els.stderr, data.text);
          break;
        case 'result':
          outcome = { ok: true, status: resp.status, data: data, requestId: requestId };
          break;
        case 'error': {
          const e = data.error && typeof data.error === 'object' ? data.error : {};
          outcome = { ok: false, status: resp.status, error: { status: resp.status, code: typeof e.code === 'string' ? e.code : 'error',
            message: typeof e.message === 'string' ? e.message : 'The run failed.', requestId: requestId, retryAfter: null } };
          break;
        }
      }
    });
    try {
      await readEvents(resp.body, parser, () => outcome !== null);
    } catch (e) {
      // The connection dropped; what arrived is on the page.
    }
    if (outcome) return outcome;
    return { ok: false, status: resp.status, error: { status: 0, code: 'stream_ended', requestId: requestId, retryAfter: null,
      message: 'The connection closed before the result arrived' + (execId ? ' (execution ' + execId + ').' : '.') } };
  }


  // ---- formatting --------------------------------------------------------

  function formatWait(sec) {
    if (sec < 60) return sec + ' s';
    const h = Math.floor(sec / 3600);
    const m = Math.ceil((sec % 3600) / 60);
    if (h === 0) return m + ' min';
    return h + ' h ' + (m === 60 ? 59 : m) + ' min';
  }

  function formatClock(sec) {
    const at = new Date(Date.now() + sec * 1000);
    return at.toLocaleTimeString([], { hour: '2-digit', minute: '2-digit' });
  }

  function debounce(fn, ms) {
    let t = 0;
    return function () {
      clearTimeout(t);
      t = setTimeout(fn, ms);
    };
  }

  // ---- snippets ----------------------------------------------------------

  function shellQuote(s) {
    return "'" + s.replace(/'/g, "'\\''") + "'";
  }

  // pyString writes s as a Python literal: a triple-quoted block for
  // multi-line code, so the snippet reads like the program.
  function pyString(s) {
    if (s.indexOf('\n') === -1 || /[\u0000-\u0008\u000b-\u001f\u007f]/.test(s)) return JSON.stringify(s);
    const body = s.replace(/\\/g, '\\\\').replace(/"(?=")|"$/g, '\\"');
    return '"""\\\n' + body + '"""';
  }

  // goString writes s as a Go literal: a raw string when it can be one.
  function goString(s) {
    if (s.indexOf('`') === -1 && s.indexOf('\r') === -1 && !/[\u0000-\u0008\u000b-\u001f\u007f]/.test(s)) return '`' + s + '`';
    return JSON.stringify(s).replace(/\\u(d[89ab][0-9a-f]{2})/gi, '\\uFFFD');
  }

  function heredoc(s) {
    let tag = 'CODE';
    for (let i = 2; new RegExp('^' + tag + '$', 'm').test(s); i++) tag = 'CODE' + i;
    return { tag: tag, text: s.endsWith('\n') ? s : s + '\n' };
  }

  function snippets() {
    const body = request();
    const code = body.code;
    const lang = body.language;
    const json = JSON.stringify(body);
    const pyArgs = ['language=' + JSON.stringify(lang)];
    if (body.timeout_s !== undefined && Number.isInteger(body.timeout_s)) pyArgs.push('timeout_s=' + body.timeout_s);
    const goOpts = ['client.WithLanguage(' + JSON.stringify(lang) + ')'];
    if (body.timeout_s !== undefined && Number.isInteger(body.timeout_s)) goOpts.push('client.WithTimeoutSeconds(' + body.timeout_s + ')');
    if (body.stdin !== undefined) goOpts.push('client.WithStdin(' + goString(body.stdin) + ')');
    const cliFlags = ['--language ' + lang];
    if (body.timeout_s !== undefined && Number.isInteger(body.timeout_s)) cliFlags.push('--timeout ' + body.timeout_s);
    const hd = heredoc(code);

    return {
      curl: [{
        note: 'POST ' + apiBase + '/v1/executions with a bearer key. The response is the JSON you see in the result panel.',
        text: 'curl -sS -X POST ' + serverURL + '/v1/executions \\\n' +
          '  -H "Authorization: Bearer $KUBO_API_KEY" \\\n' +
          '  -H "Content-Type: application/json" \\\n' +
          '  -d ' + shellQuote(json),
      }],
      python: [{
        note: 'Standard library only, Python 3.10+. Install from the repository: pip install "./sdk/python".',
        text: 'import os\n\nfrom vertal2kubo.client import KuboClient, KuboError\n\n' +
          'client = KuboClient(' + JSON.stringify(serverURL) + ', os.environ["KUBO_API_KEY"])\n\n' +
          'code = ' + pyString(code) + '\n\n' +
          'try:\n' +
          '    result = client.run(code, ' + pyArgs.join(', ') + ')\n' +
          '    print(result["status"], result["exit_code"])\n' +
          '    print(result["stdout"], end="")\n' +
          'except KuboError as e:\n' +
          '    print(e.status, e.code, e.request_id)\n',
      }],
      go: [{
        note: 'go get github.com/kuboprotocol/vertal2kubo/client',
        text: 'package main\n\nimport (\n\t"context"\n\t"fmt"\n\t"log"\n\t"os"\n\n\t"github.com/kuboprotocol/vertal2kubo/client"\n)\n\n' +
          'func main() {\n' +
          '\tc, err := client.New(' + JSON.stringify(serverURL) + ', os.Getenv("KUBO_API_KEY"))\n' +
          '\tif err != nil {\n\t\tlog.Fatal(err)\n\t}\n' +
          '\tcode := ' + goString(code) + '\n' +
          '\tres, err := c.Run(context.Background(), code, ' + goOpts.join(', ') + ')\n' +
          '\tif err != nil {\n\t\tlog.Fatal(err) // *client.Error carries the status, code and request id\n\t}\n' +
          '\tfmt.Print(res.Stdout)\n' +
          '\tfmt.Fprint(os.Stderr, res.Stderr)\n' +
          '\tfmt.Println("status:", res.Status, "exit code:", res.ExitCode)\n' +
          '}\n',
      }],
      cli: [{
        note: 'vertal run sends the program to this server; its stdout, stderr and exit code become the command\'s.',
        text: 'export KUBO_API_URL=' + serverURL + '\nexport KUBO_API_KEY=kubo_sk_...\n\n' +
          'vertal run ' + cliFlags.join(' ') + ' - <<\'' + hd.tag + '\'\n' + hd.text + hd.tag + '\n',
      }, {
        note: 'The same with the Python package:',
        text: 'python -m vertal2kubo run ' + cliFlags.join(' ') + ' ' + shellQuote(code) + '\n',
      }],
      mcp: [{
        note: 'MCP client configuration (Claude Desktop, IDE assistants) using the vertal binary:',
        text: JSON.stringify({
          mcpServers: {
            'vertal-run': {
              command: 'vertal',
              args: ['mcp'],
              env: { KUBO_API_URL: serverURL, KUBO_API_KEY: 'kubo_sk_...' },
            },
          },
        }, null, 2) + '\n',
      }, {
        note: 'The same server from the Python package:',
        text: JSON.stringify({
          mcpServers: {
            'vertal-run': {
              command: 'python',
              args: ['-m', 'vertal2kubo.mcp'],
              env: { KUBO_API_URL: serverURL, KUBO_API_KEY: 'kubo_sk_...' },
            },
          },
        }, null, 2) + '\n',
      }, {
        note: 'Claude Code:',
        text: 'claude mcp add vertal-run \\\n  --env KUBO_API_URL=' + serverURL + ' \\\n  --env KUBO_API_KEY=kubo_sk_... \\\n  -- vertal mcp\n',
      }],
    };
  }

  function copyButton(getText, label) {
    const btn = el('button', { type: 'button', class: 'btn btn-ghost btn-copy', 'aria-label': label || 'Copy' }, ['Copy']);
    btn.addEventListener('click', async () => {
      const text = getText();
      let done = false;
      try {
        await navigator.clipboard.writeText(text);
        done = true;
      } catch (e) {
        done = false;
      }
      btn.textContent = done ? 'Copied' : 'Select and copy';
      setTimeout(() => { btn.textContent = 'Copy'; }, 1600);
    });
    return btn;
  }

  function updateSnippets() {
    const blocks = snippets()[activeTab] || [];
    const nodes = blocks.map((b, i) => {
      const pre = el('pre', { tabindex: '0' }, [el('code', {}, [b.text])]);
      return el('div', { class: 'snippet', 'data-snippet': activeTab + '-' + i }, [
        el('div', { class: 'snippet-head' }, [el('p', {}, [b.note]), copyButton(() => b.text, 'Copy ' + activeTab + ' snippet')]),
        pre,
      ]);
    });
    els.panel.replaceChildren(...nodes);
    els.panel.setAttribute('aria-labelledby', 'tab-' + activeTab);
  }

  const tabs = Array.from(document.querySelectorAll('[role="tab"]'));
  function selectTab(tab, focus) {
    activeTab = tab.dataset.tab;
    for (const t of tabs) {
      const on = t === tab;
      t.setAttribute('aria-selected', String(on));
      t.tabIndex = on ? 0 : -1;
    }
    if (focus) tab.focus();
    updateSnippets();
  }
  tabs.forEach((tab, i) => {
    tab.addEventListener('click', () => selectTab(tab, false));
    tab.addEventListener('keydown', (e) => {
      let j = -1;
      if (e.key === 'ArrowRight') j = (i + 1) % tabs.length;
      if (e.key === 'ArrowLeft') j = (i - 1 + tabs.length) % tabs.length;
      if (e.key === 'Home') j = 0;
      if (e.key === 'End') j = tabs.length - 1;
      if (j >= 0) {
        e.preventDefault();
        selectTab(tabs[j], true);
      }
    });
  });

  // ---- storage -----------------------------------------------------------

  updateSnippets();
  if (currentKey()) checkKey();
  loadSession();
  document.body.dataset.ready = 'true';
})();
