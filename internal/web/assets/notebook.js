// Vertal Run notebook: cells that run, one after another, in one code
// context of a sandbox that stays (POST /v1/sandboxes, then
// POST /v1/sandboxes/{id}/run with the context's id).
//
// Everything a cell sends back is untrusted. Text goes in as text nodes
// (control characters drawn as escapes). Raster images are shown only when
// their bytes are a PNG, JPEG, GIF or WebP, and SVG only through <img>,
// where it runs no script. HTML (a pandas DataFrame's table) is shown only
// in an <iframe sandbox=""> loaded from a blob: URL: no scripts, no forms,
// no navigation of this page, an opaque origin that can read nothing of
// this one, and the page's own Content-Security-Policy besides. The blob:
// URL is revoked once the frame has loaded, so it cannot be opened on its
// own. Every other type shows as its text/plain.
'use strict';

(function () {
  const C = window.VertalCommon;
  const { sseParser, readEvents, readJSON, networkError, outputNodes, terminal, imageType, fromBase64, formatMs, el, validKeyChars } = C;
  const $ = (id) => document.getElementById(id);
  const apiBase = document.body.dataset.apiBase || '';
  const store = C.safeStorage();
  let session = null;
  const { authFor, api } = C.apiClient(apiBase, () => session);

  const STARTERS = {
    python: [
      'import statistics\n\nxs = [3, 1, 4, 1, 5, 9, 2, 6]\nprint("loaded", len(xs), "values")',
      'statistics.mean(xs)',
      'xs.append(10)\nsorted(xs)',
    ],
    javascript: [
      'const xs = [3, 1, 4, 1, 5, 9, 2, 6];\nconsole.log("loaded", xs.length, "values");',
      'xs.reduce((a, b) => a + b, 0) / xs.length',
      'xs.push(10);\n[...xs].sort((a, b) => a - b)',
    ],
  };
  const INDENT = { python: '    ', javascript: '  ' };
  const MAX_CELLS = 50;
  // What one cell's output may draw: a hostile cell can send thousands of
  // results, and each HTML one is a frame.
  const MAX_RESULTS = 50;
  const MAX_FRAMES = 10;
  // Outputs kept across a reload, in characters of JSON: per cell, and in
  // all (sessionStorage holds about 5 MB an origin).
  const MAX_KEPT_CELL = 512 * 1024;
  const MAX_KEPT = 2 * 1024 * 1024;
  const LANGUAGE_NAMES = { python: 'Python', javascript: 'JavaScript' };

  const els = {
    key: $('key'), keyToggle: $('key-toggle'), keyForget: $('key-forget'), keyStatus: $('key-status'),
    language: $('language'), image: $('image'), runAll: $('run-all'), restart: $('restart'), end: $('end'),
    session: $('session'), notice: $('notice'), cells: $('cells'), add: $('add'), template: $('cell-template'),
  };

  // ---- state -------------------------------------------------------------

  let language = store.get('vertal.nb.language');
  if (!STARTERS[language]) language = 'python';
  // nb is the session: the sandbox, its expiry and each language's context.
  const nb = loadSessionState();
  let cells = [];
  let queue = Promise.resolve();
  // batch is bumped to drop the cells still queued: End session, a cell
  // that failed or was stopped, or an API refusal (Run all stops there,
  // as a notebook's does).
  let batch = 0;
  let pending = 0; // cells queued or running
  let running = null; // the cell running now
  let tenant = ''; // the key's tenant, from the last key check

  function loadSessionState() {
    try {
      const s = JSON.parse(store.get('vertal.nb.session') || 'null');
      if (s && typeof s.sandbox === 'string' && /^sbx_[A-Za-z0-9]+$/.test(s.sandbox)) {
        const contexts = {};
        for (const [k, v] of Object.entries(s.contexts || {})) {
          if (STARTERS[k] && typeof v === 'string' && /^ctx_[A-Za-z0-9]+$/.test(v)) contexts[k] = v;
        }
        return { sandbox: s.sandbox, image: typeof s.image === 'string' ? s.image : 'default', expiresAt: Number(s.expiresAt) || 0, contexts: contexts,
          tenant: typeof s.tenant === 'string' ? s.tenant : '' };
      }
    } catch (e) { /* a broken entry is no session */ }
    return { sandbox: '', image: '', expiresAt: 0, contexts: {}, tenant: '' };
  }

  function saveSessionState() {
    if (nb.sandbox) store.set('vertal.nb.session', JSON.stringify(nb));
    else store.remove('vertal.nb.session');
    showSession();
  }

  function showSession() {
    els.image.disabled = !!nb.sandbox;
    if (!nb.sandbox) {
      els.session.textContent = 'No session yet: the first run starts a sandbox.';
      return;
    }
    let text = 'Session ' + nb.sandbox + ' (' + nb.image + ' image; end the session to use another)';
    const ctx = nb.contexts[language];
    text += ctx ? ' · ' + LANGUAGE_NAMES[language] + ' context ' + ctx : ' · no ' + LANGUAGE_NAMES[language] + ' context yet';
    if (nb.expiresAt) text += ' · ends at ' + new Date(nb.expiresAt).toLocaleTimeString([], { hour: '2-digit', minute: '2-digit' }) + ' unless you keep running cells';
    els.session.textContent = text;
  }

  function notice(text, kind) {
    els.notice.textContent = text;
    els.notice.className = 'nb-notice' + (kind ? ' nb-notice-' + kind : '');
    els.notice.hidden = !text;
  }

  // ---- API key (the playground's, shared through sessionStorage) --------

  function currentKey() {
    return els.key.value.trim();
  }
  const KEY_HINT = 'Kept only in this browser tab and sent only to this server.';
  function setKeyStatus(text, kind) {
    els.keyStatus.textContent = text;
    els.keyStatus.classList.toggle('ok', kind === 'ok');
    els.keyStatus.classList.toggle('bad', kind === 'bad');
  }
  let keyCheck = 0;
  async function checkKey() {
    const key = currentKey();
    const mine = ++keyCheck;
    if (!key && !session) return setKeyStatus(KEY_HINT, '');
    if (key && !validKeyChars(key)) return setKeyStatus('This key contains spaces or characters a key never has.', 'bad');
    const usage = await api('GET', '/v1/usage', key);
    if (mine !== keyCheck) return;
    if (usage.ok && usage.data) {
      const u = usage.data;
      const who = !key && session ? 'Signed in as ' + session.email : 'Key OK';
      setKeyStatus(who + ' · ' + (u.tenant || 'tenant') + ' · ' + (u.plan || '?') + ' plan', 'ok');
      tenant = typeof u.tenant === 'string' ? u.tenant : '';
      if (nb.sandbox && nb.tenant && tenant && nb.tenant !== tenant && pending === 0) {
        // This key cannot reach the open session: say so rather than
        // report it ended.
        const other = nb.tenant;
        resetSession();
        notice('The session that was open belongs to another key (tenant ' + other + '), which this key cannot reach: the next run starts a new sandbox. The other one ends at its expiry, or end it with its own key.', 'warn');
      }
      loadImages(key);
    } else if (usage.error) {
      setKeyStatus(usage.error.code + ': ' + usage.error.message, 'bad');
    }
  }
  async function loadImages(key) {
    const res = await api('GET', '/v1/images', key);
    if (!res.ok || !res.data || !Array.isArray(res.data.images)) return;
    const names = res.data.images.map((img) => img && img.name).filter((n) => typeof n === 'string');
    const want = nb.sandbox ? nb.image : store.get('vertal.nb.image') || 'default';
    els.image.replaceChildren(...names.map((n) => el('option', { value: n }, [n])));
    els.image.value = names.includes(want) ? want : 'default';
    els.image.hidden = names.length < 2;
  }
  let keyTimer = 0;
  els.key.addEventListener('input', () => {
    const key = currentKey();
    if (key) store.set('vertal.apiKey', key); else store.remove('vertal.apiKey');
    clearTimeout(keyTimer);
    keyTimer = setTimeout(checkKey, 600);
  });
  C.bindKeyToggle(els.key, els.keyToggle);
  els.keyForget.addEventListener('click', () => {
    els.key.value = '';
    store.remove('vertal.apiKey');
    keyCheck++;
    setKeyStatus('Key forgotten. ' + KEY_HINT, '');
  });
  els.image.addEventListener('change', () => store.set('vertal.nb.image', els.image.value));

  // ---- cells -------------------------------------------------------------

  function saveCells() {
    store.set('vertal.nb.cells.' + language, JSON.stringify(cells.map((c) => c.code.value)));
  }

  function loadCells() {
    let codes = null;
    try {
      codes = JSON.parse(store.get('vertal.nb.cells.' + language) || 'null');
    } catch (e) { codes = null; }
    if (!Array.isArray(codes) || !codes.every((c) => typeof c === 'string')) codes = STARTERS[language];
    for (const c of cells) c.clear();
    cells = [];
    els.cells.replaceChildren();
    for (const code of codes.slice(0, MAX_CELLS)) addCell(code, null);
    if (cells.length === 0) addCell('', null);
    loadOutputs();
  }

  function addCell(code, after) {
    if (cells.length >= MAX_CELLS) {
      notice('A notebook holds at most ' + MAX_CELLS + ' cells here.', 'warn');
      return null;
    }
    const node = els.template.content.firstElementChild.cloneNode(true);
    const q = (sel) => node.querySelector(sel);
    const cell = {
      node: node, code: q('.nb-code'), run: q('.nb-run'), stop: q('.nb-stop'), status: q('.nb-status'),
      count: q('.nb-count'), duration: q('.nb-duration'), output: q('.nb-output'), del: q('.nb-delete'),
      controller: null, urls: [], queued: false, record: [], replaying: false,
    };
    cell.code.value = code;
    cell.clear = () => clearOutput(cell);
    fit(cell.code);
    cell.code.addEventListener('input', () => { fit(cell.code); saveCells(); });
    cell.code.addEventListener('keydown', (e) => cellKey(e, cell));
    cell.run.addEventListener('click', () => enqueue(cell));
    cell.stop.addEventListener('click', () => { if (cell.controller) cell.controller.abort(); });
    cell.del.addEventListener('click', () => removeCell(cell));
    const at = after ? cells.indexOf(after) + 1 : cells.length;
    cells.splice(at, 0, cell);
    els.cells.insertBefore(node, at < cells.length - 1 ? cells[at + 1].node : null);
    labelCells();
    saveCells();
    return cell;
  }

  function removeCell(cell) {
    if (cell.controller || cell.queued) return; // a running cell stays until it ends
    const i = cells.indexOf(cell);
    clearOutput(cell);
    cells.splice(i, 1);
    cell.node.remove();
    if (cells.length === 0) addCell('', null);
    labelCells();
    saveCells();
    saveOutputs();
    const next = cells[Math.min(i, cells.length - 1)];
    if (next) next.code.focus();
  }

  function labelCells() {
    cells.forEach((c, i) => {
      c.node.setAttribute('aria-label', 'Cell ' + (i + 1));
      c.code.setAttribute('aria-label', 'Code of cell ' + (i + 1));
      c.run.setAttribute('aria-label', 'Run cell ' + (i + 1));
      c.del.setAttribute('aria-label', 'Delete cell ' + (i + 1));
    });
  }

  // fit grows a cell's editor with its code (3 to 30 lines), so a notebook
  // reads top to bottom without boxes inside boxes.
  function fit(ta) {
    ta.rows = Math.max(3, Math.min(30, ta.value.split('\n').length));
  }

  let escapeArmed = false;
  function cellKey(e, cell) {
    if (e.key === 'Escape') {
      escapeArmed = true;
      return;
    }
    const armed = escapeArmed;
    escapeArmed = false;
    if (e.key === 'Enter' && (e.shiftKey || e.ctrlKey || e.metaKey) && !e.altKey) {
      e.preventDefault();
      enqueue(cell);
      if (e.shiftKey) {
        const i = cells.indexOf(cell);
        const next = cells[i + 1] || addCell('', cell);
        if (next) next.code.focus();
      }
      return;
    }
    if (e.key === 'Tab' && !armed && !e.shiftKey && !e.ctrlKey && !e.metaKey && !e.altKey) {
      e.preventDefault();
      const ta = cell.code;
      const unit = INDENT[language];
      if (!document.execCommand || !document.execCommand('insertText', false, unit)) {
        ta.setRangeText(unit, ta.selectionStart, ta.selectionEnd, 'end');
        ta.dispatchEvent(new Event('input'));
      }
    }
  }

  els.add.addEventListener('click', () => {
    const c = addCell('', null);
    if (c) c.code.focus();
  });
  els.runAll.addEventListener('click', () => { for (const c of cells) enqueue(c); });
  els.language.addEventListener('change', () => {
    saveCells();
    language = els.language.value;
    store.set('vertal.nb.language', language);
    loadCells();
    showSession();
  });

  // ---- running -----------------------------------------------------------

  // enqueue runs cells one at a time, in the order asked: the context runs
  // one cell at a time anyway, and a notebook reads in that order.
  function enqueue(cell) {
    if (cell.queued || cell.controller) return;
    cell.queued = true;
    setPending(+1);
    setStatus(cell, 'queued', 'idle');
    const mine = batch;
    const lang = language;
    queue = queue.then(() => runCell(cell, lang, mine)).catch(() => {}).finally(() => setPending(-1));
  }

  // setPending keeps the language fixed while cells are queued or
  // running: a cell runs in the language it was queued in, and its
  // context is saved as that language's.
  function setPending(d) {
    pending += d;
    els.language.disabled = pending > 0;
    els.language.title = pending > 0 ? 'Wait for the cells to end (or stop them) to switch the language' : '';
  }

  // dropQueued drops the cells still waiting (the running one, if any,
  // ends as it would).
  function dropQueued() {
    batch++;
  }

  function setStatus(cell, text, kind) {
    cell.status.textContent = text;
    cell.status.className = 'badge nb-status badge-' + kind;
  }

  function clearOutput(cell) {
    for (const u of cell.urls) URL.revokeObjectURL(u);
    cell.urls = [];
    cell.output.replaceChildren();
    cell.duration.textContent = '';
    cell.record = [];
  }

  // ---- outputs kept across a reload ---------------------------------------
  // Each cell's output is recorded as it is drawn (text, results, errors,
  // notes, API errors) and kept in the tab's sessionStorage with its code,
  // status, count and duration; a reload draws it again through the same
  // functions, so it is no more trusted than it was the first time. A cell
  // whose code changed since gets none back.

  function record(cell, item) {
    if (cell.record && !cell.replaying) cell.record.push(item);
  }

  function addNote(cell, text) {
    record(cell, ['note', text]);
    cell.output.append(el('p', { class: 'nb-note' }, [text]));
  }

  function saveOutputs() {
    const key = 'vertal.nb.outputs.' + language;
    let total = 0;
    const saved = cells.map((c) => {
      if (c.controller || c.queued || !c.record || c.record.length === 0 && !c.status.textContent) return null;
      let items = JSON.stringify(c.record);
      if (items.length > MAX_KEPT_CELL || total + items.length > MAX_KEPT) {
        items = JSON.stringify([['note', 'This output was too large to keep across a reload; run the cell again to see it.']]);
      }
      total += items.length;
      return { code: c.code.value, status: c.status.textContent, kind: c.status.className.replace(/^.*badge-/, ''),
        count: c.count.textContent, duration: c.duration.textContent, items: items };
    });
    store.remove(key); // a write refused for room leaves nothing stale
    store.set(key, JSON.stringify(saved));
  }

  function loadOutputs() {
    let saved = null;
    try {
      saved = JSON.parse(store.get('vertal.nb.outputs.' + language) || 'null');
    } catch (e) { saved = null; }
    if (!Array.isArray(saved)) return;
    cells.forEach((c, i) => {
      const o = saved[i];
      if (!o || typeof o !== 'object' || o.code !== c.code.value || typeof o.items !== 'string') return;
      let items;
      try { items = JSON.parse(o.items); } catch (e) { return; }
      if (!Array.isArray(items)) return;
      c.record = items;
      c.replaying = true;
      const live = liveOutput(c);
      for (const it of items) {
        if (!Array.isArray(it)) continue;
        if (it[0] === 'text' && (it[1] === 'stdout' || it[1] === 'stderr') && typeof it[2] === 'string') live.text(it[1], it[2]);
        else if (it[0] === 'result' && it[1] && typeof it[1] === 'object') live.result(it[1]);
        else if (it[0] === 'error' && it[1] && typeof it[1] === 'object') live.error(it[1]);
        else if (it[0] === 'note' && typeof it[1] === 'string') addNote(c, it[1]);
        else if (it[0] === 'api' && it[1] && typeof it[1] === 'object') showAPIError(c, it[1]);
      }
      c.replaying = false;
      const kind = typeof o.kind === 'string' && /^[a-z_]+$/.test(o.kind) ? o.kind : 'idle';
      if (typeof o.status === 'string') setStatus(c, o.status.slice(0, 40), kind);
      if (typeof o.count === 'string' && /^\[[0-9 ]*\]$/.test(o.count)) c.count.textContent = o.count;
      if (typeof o.duration === 'string') c.duration.textContent = o.duration.slice(0, 40);
    });
  }

  async function runCell(cell, lang, mine) {
    cell.queued = false;
    if (!cells.includes(cell)) return;
    if (mine !== batch) {
      setStatus(cell, 'not run', 'idle');
      return;
    }
    const key = currentKey();
    clearOutput(cell);
    if (!key && !session) {
      setStatus(cell, 'not sent', 'error');
      showAPIError(cell, { code: 'missing_key', message: 'Paste an API key first. It starts with kubo_sk_.' });
      setKeyStatus('Paste an API key first. It starts with kubo_sk_.', 'bad');
      els.key.focus();
      return;
    }
    if (key && !validKeyChars(key)) {
      setStatus(cell, 'not sent', 'error');
      showAPIError(cell, { code: 'invalid_key', message: 'The key contains spaces or characters a key never has.' });
      return;
    }
    cell.controller = new AbortController();
    running = cell;
    cell.run.disabled = true;
    cell.stop.hidden = false;
    setStatus(cell, 'running…', 'running');
    const code = cell.code.value;
    try {
      const res = await runInSession(key, code, cell, lang);
      if (res.error && res.error.code === 'stopped') {
        setStatus(cell, 'stopped', 'timed_out');
        addNote(cell, res.error.message);
        dropQueued();
      } else if (res.error) {
        setStatus(cell, res.error.status ? 'HTTP ' + res.error.status : 'not sent', res.error.status ? 'http' : 'error');
        showAPIError(cell, res.error);
        if (res.error.status === 401) setKeyStatus(res.error.code + ': ' + res.error.message, 'bad');
        dropQueued(); // the next cells would meet the same refusal
      } else {
        showEnd(cell, res.end, lang);
        if (!res.end || res.end.status !== 'succeeded') dropQueued();
      }
    } finally {
      cell.controller = null;
      running = null;
      cell.run.disabled = false;
      cell.stop.hidden = true;
      saveOutputs();
    }
  }

  // runInSession runs code in this notebook's context, starting a sandbox
  // when there is none and telling the user when the state was lost: a
  // sandbox that ended (expired, killed) or a context that is gone (a pause
  // ends contexts) means earlier cells' variables are gone too.
  async function runInSession(key, code, cell, lang) {
    for (let attempt = 0; attempt < 2; attempt++) {
      if (!nb.sandbox) {
        const started = await startSandbox(key);
        if (started.error) return started;
      }
      await keepAlive(key);
      const ctx = nb.contexts[lang];
      const body = ctx ? { code: code, context_id: ctx } : { code: code, language: lang };
      const res = await streamCell(key, body, cell);
      // Only a cell that never started is sent again: one that began and
      // lost its sandbox half-way may have done half its work.
      if (!res.error || res.started || attempt > 0 || cell.controller.signal.aborted) return res;
      const gone = await whatIsGone(key, res.error, lang);
      if (gone === 'sandbox') {
        resetSession();
        notice('The session\'s sandbox had ended (or is not visible to this key), so a new one was started: variables from earlier cells are gone; run them again.', 'warn');
      } else if (gone === 'context') {
        delete nb.contexts[lang];
        saveSessionState();
        notice('The ' + LANGUAGE_NAMES[lang] + ' interpreter had ended (a pause or a restart elsewhere), so a new one was started: variables from earlier cells are gone.', 'warn');
      } else {
        return res;
      }
      clearOutput(cell);
    }
    return { error: { status: 0, code: 'session_lost', message: 'The session could not be started again.' } };
  }

  async function whatIsGone(key, err, lang) {
    if (err.status !== 404 && err.code !== 'sandbox_not_running') return '';
    const info = await api('GET', '/v1/sandboxes/' + encodeURIComponent(nb.sandbox), key);
    if (!info.ok) return info.status === 404 ? 'sandbox' : '';
    if (!info.data || info.data.status === 'ended') return 'sandbox';
    return nb.contexts[lang] && err.status === 404 ? 'context' : '';
  }

  async function startSandbox(key) {
    const body = {};
    const image = !els.image.hidden && els.image.value ? els.image.value : 'default';
    if (image !== 'default') body.image = image;
    els.session.textContent = 'Starting a sandbox…';
    const res = await api('POST', '/v1/sandboxes', key, body);
    if (!res.ok || !res.data || typeof res.data.id !== 'string') {
      showSession();
      const err = res.error || { status: res.status, code: 'unexpected_response', message: 'The server sent an answer the notebook does not understand.' };
      if (err.code === 'sandbox_limit') err.hint = 'Your plan\'s sandboxes are all in use: end another session (vertal sandbox ls, then vertal sandbox rm ID) or wait for one to expire.';
      if (err.status === 404 && /not enabled/.test(err.message || '')) err.hint = 'This server runs one-shot executions only; the playground works without sandboxes.';
      return { error: err };
    }
    nb.sandbox = res.data.id;
    nb.image = typeof res.data.image === 'string' ? res.data.image : image;
    nb.expiresAt = Date.parse(res.data.expires_at) || 0;
    nb.contexts = {};
    nb.tenant = tenant;
    notice('', '');
    saveSessionState();
    return {};
  }

  // keepAlive moves the sandbox's expiry five minutes on when less than
  // three are left, within the plan's maximum lifetime (past it the server
  // refuses, and the sandbox ends when the plan says).
  async function keepAlive(key) {
    if (!nb.expiresAt || nb.expiresAt - Date.now() > 3 * 60 * 1000) return;
    const res = await api('POST', '/v1/sandboxes/' + encodeURIComponent(nb.sandbox) + '/timeout', key, { timeout_s: 300 });
    if (res.ok && res.data && res.data.expires_at) {
      nb.expiresAt = Date.parse(res.data.expires_at) || nb.expiresAt;
      saveSessionState();
    }
  }

  function resetSession() {
    nb.sandbox = '';
    nb.image = '';
    nb.expiresAt = 0;
    nb.contexts = {};
    nb.tenant = '';
    saveSessionState();
  }

  // streamCell posts one cell with Accept: text/event-stream and shows its
  // events as they come. It resolves to {end} (the outcome) or {error}.
  async function streamCell(key, body, cell) {
    const auth = authFor(key);
    let resp;
    try {
      resp = await fetch(apiBase + '/v1/sandboxes/' + encodeURIComponent(nb.sandbox) + '/run', {
        method: 'POST',
        headers: Object.assign({ Accept: 'text/event-stream', 'Content-Type': 'application/json' }, auth.headers),
        body: JSON.stringify(body),
        cache: 'no-store',
        credentials: auth.credentials,
        signal: cell.controller.signal,
      });
    } catch (e) {
      return cell.controller.signal.aborted ? stopped() : networkError(e);
    }
    const type = (resp.headers.get('Content-Type') || '').split(';')[0].trim().toLowerCase();
    if (!resp.ok || type !== 'text/event-stream' || !resp.body) {
      const res = await readJSON(resp);
      return res.ok ? { end: res.data } : { error: res.error };
    }
    const live = liveOutput(cell);
    let outcome = null;
    const started = (o) => Object.assign(o, { started: true });
    const parser = sseParser((ev) => {
      let data = null;
      try {
        data = JSON.parse(ev.data);
      } catch (e) {
        return;
      }
      if (!data || typeof data !== 'object') return;
      switch (ev.event) {
        case 'stdout':
        case 'stderr':
          if (typeof data.text === 'string') live.text(ev.event, data.text);
          break;
        case 'result':
          live.result(data);
          break;
        case 'error':
          if (data.error && typeof data.error === 'object') { // the API's, not the cell's
            outcome = { error: { status: resp.status, code: String(data.error.code || 'error'), message: String(data.error.message || 'The run failed.') } };
          } else {
            live.error(data);
          }
          break;
        case 'end':
          outcome = { end: data, live: live };
          break;
      }
    });
    try {
      await readEvents(resp.body, parser, () => outcome !== null);
    } catch (e) {
      if (cell.controller.signal.aborted) return started(stopped());
    }
    if (outcome) return started(outcome);
    return started({ error: { status: 0, code: 'stream_ended', message: 'The connection closed before the cell ended.' } });
  }

  function stopped() {
    return { error: { status: 0, code: 'stopped', message: 'Stopped: the cell was interrupted (KeyboardInterrupt in Python) and the context keeps its state.' } };
  }

  // liveOutput appends a cell's output in the order it arrives: runs of
  // stdout and stderr, results (values, figures) and the error.
  function liveOutput(cell) {
    let last = null;
    let lastKind = '';
    let shown = false;
    let results = 0;
    let frames = 0;
    let dropped = null;
    return {
      text(kind, s) {
        record(cell, ['text', kind, s]);
        if (lastKind !== kind) {
          const pre = el('pre', { class: 'out nb-' + kind }, []);
          cell.output.append(pre);
          last = terminal(pre);
          lastKind = kind;
        }
        last.append(s);
        shown = true;
      },
      result(r) {
        lastKind = '';
        shown = true;
        const html = r && r.data && typeof r.data === 'object' && typeof r.data['text/html'] === 'string';
        if (results >= MAX_RESULTS || (html && frames >= MAX_FRAMES)) {
          // Kept across a reload as a stand-in that is dropped again.
          record(cell, ['result', { data: { 'text/html': '' } }]);
          if (!dropped) {
            dropped = el('p', { class: 'nb-note' }, []);
            dropped.count = 0;
            cell.output.append(dropped);
          }
          dropped.count++;
          dropped.textContent = dropped.count + ' more result' + (dropped.count === 1 ? '' : 's') + ' not shown: the notebook draws at most ' +
            MAX_RESULTS + ' results and ' + MAX_FRAMES + ' HTML frames per cell.';
          return;
        }
        record(cell, ['result', r]);
        results++;
        if (html) frames++;
        cell.output.append(resultNode(cell, r));
      },
      error(e) {
        record(cell, ['error', e]);
        lastKind = '';
        cell.output.append(errorNode(e));
        shown = true;
      },
      get shown() { return shown; },
    };
  }

  // showEnd writes what the end event (or the JSON answer) says. When
  // nothing was streamed (a server that answered JSON), it shows it all.
  function showEnd(cell, r, lang) {
    if (!r || typeof r !== 'object') return;
    if (!cell.output.hasChildNodes()) {
      const live = liveOutput(cell);
      if (typeof r.stdout === 'string' && r.stdout) live.text('stdout', r.stdout);
      if (typeof r.stderr === 'string' && r.stderr) live.text('stderr', r.stderr);
      for (const res of Array.isArray(r.results) ? r.results : []) live.result(res);
      if (r.error && typeof r.error === 'object') live.error(r.error);
    }
    const status = typeof r.status === 'string' && /^[a-z_]+$/.test(r.status) ? r.status : 'error';
    setStatus(cell, status, status);
    cell.count.textContent = Number.isInteger(r.execution_count) && r.execution_count > 0 ? '[' + r.execution_count + ']' : '[ ]';
    cell.duration.textContent = typeof r.duration_ms !== 'number' ? '' : r.duration_ms < 1 ? '< 1 ms' : formatMs(r.duration_ms);
    if (r.truncated) addNote(cell, 'Output was cut at the plan\'s cap.');
    if (typeof r.context_id === 'string' && /^ctx_[A-Za-z0-9]+$/.test(r.context_id) && nb.contexts[lang] !== r.context_id) {
      nb.contexts[lang] = r.context_id;
      saveSessionState();
    }
  }

  function showAPIError(cell, err) {
    record(cell, ['api', { code: err.code, message: err.message, hint: err.hint }]);
    const box = el('div', { class: 'api-error', role: 'alert' }, [
      el('p', { class: 'api-error-head' }, [el('code', {}, [String(err.code || 'error')])]),
      el('p', { class: 'api-error-message' }, [String(err.message || '')]),
    ]);
    if (err.hint) box.append(el('p', { class: 'api-error-hint' }, [err.hint]));
    cell.output.append(box);
  }

  function errorNode(e) {
    // The head is one line, clipped: the traceback below has it all.
    let head = (String(e.name || 'Error') + (e.value ? ': ' + String(e.value) : '')).split('\n')[0];
    if (head.length > 200) head = head.slice(0, 200) + '…';
    const pre = el('pre', { class: 'out nb-traceback' }, []);
    pre.append(...outputNodes(typeof e.traceback === 'string' && e.traceback ? e.traceback : head));
    return el('div', { class: 'nb-error' }, [el('p', { class: 'nb-error-head' }, [head]), pre]);
  }

  // resultNode draws one MIME bundle: an image when the bytes are one, HTML
  // in a sandboxed frame, or else its text/plain.
  function resultNode(cell, r) {
    const data = r && r.data && typeof r.data === 'object' ? r.data : {};
    const text = typeof data['text/plain'] === 'string' ? data['text/plain'] : '';
    const wrap = el('div', { class: 'nb-result' + (r.main ? ' nb-main' : '') }, []);
    for (const type of ['image/png', 'image/jpeg', 'image/gif']) {
      if (typeof data[type] !== 'string') continue;
      let bytes;
      try {
        bytes = fromBase64(data[type].replace(/\s+/g, ''));
      } catch (e) {
        continue;
      }
      const sniffed = imageType(bytes);
      if (!sniffed) continue;
      const url = URL.createObjectURL(new Blob([bytes], { type: sniffed }));
      cell.urls.push(url);
      const img = el('img', { src: url, alt: text || 'figure', class: 'nb-image' }, []);
      // Bytes that start like an image and then fail to decode show as a
      // note and the value's text, not as a broken-image icon.
      img.addEventListener('error', () => {
        const pre = el('pre', { class: 'out nb-text' }, []);
        pre.append(...outputNodes(text));
        img.replaceWith(el('p', { class: 'nb-note nb-bad-image' }, ['An image (' + sniffed + ') that could not be drawn.']), ...(text ? [pre] : []));
      }, { once: true });
      wrap.append(img);
      return wrap;
    }
    if (typeof data['image/svg+xml'] === 'string') {
      const url = URL.createObjectURL(new Blob([data['image/svg+xml']], { type: 'image/svg+xml' }));
      const img = el('img', { src: url, alt: text || 'figure', class: 'nb-image' }, []);
      img.addEventListener('load', () => URL.revokeObjectURL(url), { once: true });
      img.addEventListener('error', () => URL.revokeObjectURL(url), { once: true });
      wrap.append(img);
      return wrap;
    }
    if (typeof data['text/html'] === 'string') {
      wrap.append(htmlFrame(cell, data['text/html']));
      if (text) {
        const pre = el('pre', { class: 'out nb-text' }, []);
        pre.append(...outputNodes(text));
        wrap.append(el('details', { class: 'nb-as-text' }, [el('summary', {}, ['As text']), pre]));
      }
      return wrap;
    }
    const pre = el('pre', { class: 'out nb-text' }, []);
    pre.append(...outputNodes(text));
    wrap.append(pre);
    return wrap;
  }

  // htmlFrame shows untrusted HTML with scripts, forms, popups and
  // navigation off (sandbox="" grants nothing) and an opaque origin. Its
  // height is guessed from the rows, as a frame with no script cannot say.
  // frameCSS is assets/frame.css, the stylesheet of HTML results' frames;
  // until it has loaded (or if it cannot), frames go without it.
  let frameCSS = '';
  fetch('/assets/frame.css').then((r) => (r.ok ? r.text() : '')).then((t) => { frameCSS = t; }, () => {});

  function htmlFrame(cell, html) {
    // frameCSS goes in as it is: the page's CSP allows that one inline
    // stylesheet by its hash, and no other (a result's own <style>).
    const doc = '<!doctype html><meta charset="utf-8"><meta name="color-scheme" content="light">' +
      (frameCSS ? '<style>' + frameCSS + '</style>' : '') + html;
    const url = URL.createObjectURL(new Blob([doc], { type: 'text/html' }));
    const rows = (html.match(/<tr[\s>]/gi) || []).length;
    const lines = Math.max(3, Math.min(24, rows ? rows + 2 : html.split('\n').length));
    const frame = el('iframe', {
      sandbox: '', src: url, class: 'nb-html', title: 'HTML result (sandboxed, scripts off)',
      referrerpolicy: 'no-referrer', loading: 'lazy',
    }, []);
    frame.style.height = (lines * 1.6 + 1.5) + 'em';
    const revoke = () => URL.revokeObjectURL(url);
    frame.addEventListener('load', revoke, { once: true });
    // A frame out of sight loads when it is scrolled to (loading=lazy):
    // until then its URL is the cell's, revoked when the output is cleared.
    cell.urls.push(url);
    return frame;
  }

  // ---- session controls --------------------------------------------------

  els.restart.addEventListener('click', async () => {
    const ctx = nb.contexts[language];
    if (!nb.sandbox || !ctx) {
      notice('Nothing to restart: no ' + language + ' interpreter has run yet.', '');
      return;
    }
    els.restart.disabled = true;
    const res = await api('POST', '/v1/sandboxes/' + encodeURIComponent(nb.sandbox) + '/contexts/' + encodeURIComponent(ctx) + '/restart', currentKey());
    els.restart.disabled = false;
    if (res.ok) {
      for (const c of cells) c.count.textContent = '[ ]';
      notice('Kernel restarted: the interpreter starts afresh, so earlier cells\' variables are gone; files in /home/user stay.', 'ok');
    } else if (res.status === 404) {
      delete nb.contexts[language];
      saveSessionState();
      notice('That interpreter had already ended; the next run starts a new one.', '');
    } else {
      notice(res.error.code + ': ' + res.error.message, 'bad');
    }
  });

  els.end.addEventListener('click', async () => {
    if (!nb.sandbox) {
      notice('No session to end.', '');
      return;
    }
    els.end.disabled = true;
    // The queued cells are not run in a new sandbox, and the running one
    // stops: ending the session ends its work.
    dropQueued();
    if (running && running.controller) running.controller.abort();
    const res = await api('DELETE', '/v1/sandboxes/' + encodeURIComponent(nb.sandbox), currentKey());
    els.end.disabled = false;
    if (res.ok) {
      resetSession();
      for (const c of cells) c.count.textContent = '[ ]';
      notice('Session ended: the sandbox is deleted. The next run starts a new one.', 'ok');
    } else if (res.status === 404) {
      resetSession();
      for (const c of cells) c.count.textContent = '[ ]';
      notice('That sandbox is not visible to this key: it had already ended, or it belongs to another key. The next run starts a new one.', '');
    } else {
      notice(res.error.code + ': ' + res.error.message, 'bad');
    }
  });

  // ---- start -------------------------------------------------------------

  els.language.value = language;
  els.key.value = store.get('vertal.apiKey') || '';
  loadCells();
  showSession();
  if (currentKey()) checkKey();
  C.loadSession().then((s) => {
    if (!s) return;
    session = s;
    if (!currentKey()) checkKey();
  });
  document.body.dataset.ready = 'true';
})();
