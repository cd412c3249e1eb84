// Vertal Run: what the playground and the notebook share. Program output
// is untrusted: these helpers only ever make text nodes and elements with
// attributes set one by one (the pages' Content-Security-Policy enforces
// Trusted Types, so an innerHTML assignment would throw).
'use strict';

window.VertalCommon = (function () {
  // sseParser splits a text/event-stream into events as the HTML standard
  // reads it: lines end with CR, LF or CRLF, a blank line ends an event,
  // ':' starts a comment (the heartbeat), and data lines are joined by LF.
  function sseParser(onEvent) {
    let buf = '';
    let data = [];
    let event = '';
    let id = '';
    function line(l) {
      if (l === '') {
        if (data.length > 0) onEvent({ event: event || 'message', data: data.join('\n'), id: id });
        data = [];
        event = '';
        return;
      }
      if (l[0] === ':') return;
      const i = l.indexOf(':');
      const field = i === -1 ? l : l.slice(0, i);
      let value = i === -1 ? '' : l.slice(i + 1);
      if (value[0] === ' ') value = value.slice(1);
      if (field === 'data') data.push(value);
      else if (field === 'event') event = value;
      else if (field === 'id') id = value;
    }
    return {
      push(text) {
        buf += text;
        const re = /\r\n|\r|\n/g;
        let start = 0;
        let m;
        while ((m = re.exec(buf)) !== null) {
          // A CR at the very end may be the first half of a CRLF.
          if (m[0] === '\r' && m.index === buf.length - 1) break;
          line(buf.slice(start, m.index));
          start = m.index + m[0].length;
        }
        buf = buf.slice(start);
      },
    };
  }

  async function readJSON(resp) {
    const requestId = resp.headers.get('X-Request-ID') || '';
    let data = null;
    try {
      data = JSON.parse(await resp.text());
    } catch (e) {
      data = null;
    }
    if (resp.ok) return { ok: true, status: resp.status, data: data, requestId: requestId };
    const retry = resp.headers.get('Retry-After');
    const retryAfter = retry !== null && /^\d+$/.test(retry.trim()) ? Number(retry.trim()) : null;
    const e = data && data.error && typeof data.error === 'object' ? data.error : null;
    return {
      ok: false, status: resp.status, data: data, requestId: requestId,
      error: {
        status: resp.status,
        code: e && typeof e.code === 'string' ? e.code : 'http_' + resp.status,
        message: e && typeof e.message === 'string' ? e.message : (resp.statusText || 'The server answered with HTTP ' + resp.status + '.'),
        requestId: (data && typeof data.request_id === 'string' && data.request_id) || requestId,
        retryAfter: retryAfter,
      },
    };
  }

  function outputNodes(s) {
    const parts = [];
    const text = s.replace(/\r\n/g, '\n');
    // C0 controls but tab and newline, DEL, C1 controls, and the bidi
    // marks, overrides and isolates that would reorder the text around
    // them ("\u202eevil" draws as "live").
    const re = /[\u0000-\u0008\u000b-\u001f\u007f-\u009f\u200e\u200f\u202a-\u202e\u2066-\u2069]/g;
    let last = 0;
    let m;
    while ((m = re.exec(text)) !== null) {
      if (m.index > last) parts.push(document.createTextNode(text.slice(last, m.index)));
      const code = m[0].charCodeAt(0);
      const mark = document.createElement('span');
      mark.className = 'ctl';
      mark.title = 'control character U+' + code.toString(16).toUpperCase().padStart(4, '0');
      mark.textContent = code === 13 ? '\\r' : code < 0x100 ? '\\x' + code.toString(16).padStart(2, '0') : '\\u' + code.toString(16).padStart(4, '0');
      parts.push(mark);
      last = m.index + 1;
    }
    if (last < text.length) parts.push(document.createTextNode(text.slice(last)));
    return parts;
  }

  // terminal draws a stream of program output into pre as a terminal
  // would, for the two things notebooks meet most: "\r" goes back to the
  // start of the line, so a progress bar redraws in place (the text after a
  // line's last "\r" is what stays, as in Jupyter), and ANSI SGR codes set
  // a colour (the 16 standard ones) or bold. Only the fixed class names
  // ansi-fg-0..15 and ansi-bold are ever set; any other escape sequence is
  // dropped and other control characters are marked as outputNodes marks
  // them. Lines that have ended are drawn once; only the open line is
  // redrawn as chunks arrive, so a long output costs no more than its size.
  function terminal(pre) {
    let state = { fg: -1, bold: false }; // at the start of the open line
    let open = ''; // the open line's text
    let held = ''; // an escape sequence cut off by the chunk's end
    const tail = document.createElement('span');
    pre.append(tail);
    const esc = /\x1b\[([0-9;?]*)([@-~])|\x1b[@-_]?/g;

    function sgr(st, params) {
      const ps = params === '' ? [0] : params.split(';').map((p) => (p === '' ? 0 : Number(p)));
      for (let i = 0; i < ps.length; i++) {
        const p = ps[i];
        if (p === 0) { st.fg = -1; st.bold = false; }
        else if (p === 1) st.bold = true;
        else if (p === 22) st.bold = false;
        else if (p >= 30 && p <= 37) st.fg = p - 30;
        else if (p >= 90 && p <= 97) st.fg = p - 90 + 8;
        else if (p === 39) st.fg = -1;
        else if (p === 38 || p === 48) i += ps[i + 1] === 5 ? 2 : ps[i + 1] === 2 ? 4 : 1; // 256 and true colour: not drawn
      }
    }
    // draw appends segment's text to into (when given) with state st,
    // which its SGR codes change as it goes.
    function draw(seg, st, into) {
      let last = 0;
      let m;
      const put = (text) => {
        if (!text || !into) return;
        const nodes = outputNodes(text);
        if (st.fg < 0 && !st.bold) { into.append(...nodes); return; }
        const span = document.createElement('span');
        span.className = (st.fg >= 0 ? 'ansi-fg-' + st.fg : '') + (st.bold ? ' ansi-bold' : '');
        span.append(...nodes);
        into.append(span);
      };
      esc.lastIndex = 0;
      while ((m = esc.exec(seg)) !== null) {
        put(seg.slice(last, m.index));
        if (m[2] === 'm') sgr(st, m[1]);
        last = m.index + m[0].length;
      }
      put(seg.slice(last));
    }
    // line draws one line: the segments a "\r" overwrote only change the
    // state; the last one that is not empty is drawn.
    function line(text, st, into) {
      const segs = text.split('\r');
      let keep = segs.length - 1;
      while (keep > 0 && segs[keep] === '') keep--;
      for (let i = 0; i < segs.length; i++) draw(segs[i], st, i === keep ? into : null);
    }
    return {
      append(s) {
        let text = open + held + s;
        held = '';
        const cut = /\x1b(\[[0-9;?]*)?$/.exec(text);
        if (cut) { held = cut[0]; text = text.slice(0, cut.index); }
        const nl = text.lastIndexOf('\n');
        if (nl >= 0) {
          const done = document.createDocumentFragment();
          const lines = text.slice(0, nl).split('\n');
          for (const l of lines) { line(l.replace(/\r$/, ''), state, done); done.append('\n'); }
          pre.insertBefore(done, tail);
          text = text.slice(nl + 1);
        }
        // What a later "\r" will overwrite is folded into the state now,
        // so a bar that redraws for an hour keeps the open line short.
        const r = text.lastIndexOf('\r', text.length - 2);
        if (r >= 0) { draw(text.slice(0, r), state, null); text = text.slice(r + 1); }
        open = text;
        tail.replaceChildren();
        line(open, { fg: state.fg, bold: state.bold }, tail);
      },
    };
  }

  // imageType sniffs a raster image from its first bytes, as the MCP
  // server does; a file's name says nothing about what it holds.
  function imageType(b) {
    const starts = (sig, at) => sig.every((v, i) => b[(at || 0) + i] === v);
    if (starts([0x89, 0x50, 0x4e, 0x47, 0x0d, 0x0a, 0x1a, 0x0a])) return 'image/png';
    if (starts([0xff, 0xd8, 0xff])) return 'image/jpeg';
    if (starts([0x47, 0x49, 0x46, 0x38]) && (b[4] === 0x37 || b[4] === 0x39) && b[5] === 0x61) return 'image/gif';
    if (starts([0x52, 0x49, 0x46, 0x46]) && starts([0x57, 0x45, 0x42, 0x50, 0x56, 0x50], 8)) return 'image/webp';
    return '';
  }

  function fromBase64(s) {
    const bin = atob(s);
    const bytes = new Uint8Array(bin.length);
    for (let i = 0; i < bin.length; i++) bytes[i] = bin.charCodeAt(i);
    return bytes;
  }

  function formatMs(ms) {
    if (ms < 1000) return ms + ' ms';
    return (ms / 1000).toFixed(ms < 10000 ? 2 : 1) + ' s';
  }

  function formatBytes(n) {
    if (n < 1024) return n + ' B';
    if (n < 1024 * 1024) return (n / 1024).toFixed(1) + ' KB';
    return (n / 1024 / 1024).toFixed(1) + ' MB';
  }

  function el(tag, attrs, children) {
    const node = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) node.setAttribute(k, v);
    for (const c of children || []) node.append(c);
    return node;
  }

  // sessionStorage can be missing or throw (privacy modes); the playground
  // still works, it just forgets on reload.
  function safeStorage() {
    let s = null;
    try {
      s = window.sessionStorage;
      s.setItem('vertal.probe', '1');
      s.removeItem('vertal.probe');
    } catch (e) {
      s = null;
    }
    return {
      get: (k) => { try { return s ? s.getItem(k) : null; } catch (e) { return null; } },
      set: (k, v) => { try { if (s) s.setItem(k, v); } catch (e) { /* full or disabled */ } },
      remove: (k) => { try { if (s) s.removeItem(k); } catch (e) { /* disabled */ } },
    };
  }

  function validKeyChars(key) {
    return /^[\x21-\x7e]+$/.test(key);
  }

  function toBase64(bytes) {
    let bin = '';
    for (let i = 0; i < bytes.length; i += 0x8000) {
      bin += String.fromCharCode.apply(null, bytes.subarray(i, i + 0x8000));
    }
    return btoa(bin);
  }

  function networkError(e) {
    return { ok: false, status: 0, error: { status: 0, code: 'network_error', message: 'Could not reach the API (' + (e && e.message ? e.message : 'network error') + ').', retryAfter: null } };
  }

  // apiClient makes the calls of a page whose API lives at apiBase. A
  // signed-in browser (GET /session) calls without a key: the session
  // cookie goes along and its CSRF token in X-CSRF-Token, which another
  // origin can neither read nor send. A key, when there is one, wins.
  // getSession returns the page's session, or null.
  function apiClient(apiBase, getSession) {
      // authFor returns the headers and credentials mode of a call with key,
    // or with the session when there is no key.
      function authFor(key) {
      if (key) return { headers: { Authorization: 'Bearer ' + key }, credentials: 'omit' };
      const session = getSession();
      if (session) return { headers: { 'X-CSRF-Token': session.csrf }, credentials: 'same-origin' };
      return { headers: {}, credentials: 'omit' };
    }

    // api calls the API and normalises the outcome:
    // {ok, status, data, requestId, error: {status, code, message, requestId, retryAfter}}.
    async function api(method, path, key, body) {
      const auth = authFor(key);
      const init = {
        method: method,
        headers: Object.assign({ Accept: 'application/json' }, auth.headers),
        cache: 'no-store',
        credentials: auth.credentials,
      };
      if (body !== undefined) {
        init.headers['Content-Type'] = 'application/json';
        init.body = JSON.stringify(body);
      }
      let resp;
      try {
        resp = await fetch(apiBase + path, init);
      } catch (e) {
        return networkError(e);
      }
      return readJSON(resp);
    }
    return { authFor: authFor, api: api };
  }

  // bindKeyToggle makes a button show and hide a password field.
  function bindKeyToggle(input, button) {
    button.addEventListener('click', () => {
      const show = input.type === 'password';
      input.type = show ? 'text' : 'password';
      button.textContent = show ? 'Hide' : 'Show';
      button.setAttribute('aria-pressed', String(show));
    });
  }

  // readEvents feeds a response's body to an sseParser until done() says
  // the outcome is known or the stream ends (then a last blank line ends
  // an event the server left open), and cancels the rest. It throws when
  // the connection drops or the fetch was aborted.
  async function readEvents(body, parser, done) {
    const reader = body.getReader();
    const decoder = new TextDecoder();
    for (;;) {
      const { value, done: ended } = await reader.read();
      if (ended) break;
      parser.push(decoder.decode(value, { stream: true }));
      if (done()) {
        reader.cancel().catch(() => {});
        return;
      }
    }
    parser.push(decoder.decode() + '\n\n');
  }

  // loadSession asks this server whether the browser is signed in; it
  // resolves to {email, csrf, ...} or null (no accounts, or signed out).
  async function loadSession() {
    try {
      const resp = await fetch('/session', { headers: { Accept: 'application/json' }, credentials: 'same-origin', cache: 'no-store' });
      if (!resp.ok) return null;
      const body = await resp.json();
      return body && body.signed_in && body.csrf ? body : null;
    } catch (e) {
      return null; // no accounts on this server
    }
  }

  return Object.freeze({
    apiClient, loadSession, bindKeyToggle, sseParser, readEvents, readJSON, networkError, outputNodes, terminal, imageType,
    fromBase64, toBase64, formatMs, formatBytes, el, safeStorage, validKeyChars,
  });
})();
