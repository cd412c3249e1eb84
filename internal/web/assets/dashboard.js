// Vertal Run dashboard.
//
// A new key is asked for with fetch, so it only ever lives in this page's
// DOM (set as text) and a reload cannot show it again or create another.
// The snippets are filled in by replacing the placeholder in their text.
'use strict';

(function () {
  const PLACEHOLDER = 'kubo_sk_YOUR_KEY';
  const csrf = document.body.dataset.csrf || '';
  const $ = (id) => document.getElementById(id);

  document.addEventListener('click', (ev) => {
    const btn = ev.target.closest('button.copy');
    if (!btn) return;
    const el = $(btn.dataset.copy);
    if (!el) return;
    const done = () => { btn.textContent = 'Copied'; setTimeout(() => { btn.textContent = 'Copy'; }, 1500); };
    if (navigator.clipboard && navigator.clipboard.writeText) {
      navigator.clipboard.writeText(el.textContent).then(done, () => select(el));
    } else {
      select(el);
    }
  });

  function select(el) {
    const r = document.createRange();
    r.selectNodeContents(el);
    const s = window.getSelection();
    s.removeAllRanges();
    s.addRange(r);
  }

  const form = $('create-key-form');
  if (!form) return;
  form.addEventListener('submit', async (ev) => {
    ev.preventDefault();
    const err = $('key-error');
    err.hidden = true;
    // The previous new key leaves the page: it was to be copied already.
    $('newkey').hidden = true;
    $('newkey-secret').textContent = '';
    let resp, body;
    try {
      resp = await fetch('/dashboard/keys', {
        method: 'POST',
        headers: { Accept: 'application/json', 'X-CSRF-Token': csrf },
        credentials: 'same-origin',
        cache: 'no-store',
      });
      body = await resp.json();
    } catch (e) {
      err.textContent = 'Could not reach the server.';
      err.hidden = false;
      return;
    }
    if (!resp.ok) {
      err.textContent = (body && body.error && body.error.message) || ('The server answered ' + resp.status + '.');
      err.hidden = false;
      return;
    }
    $('newkey-secret').textContent = body.api_key;
    const idEl = $('newkey-id');
    if (idEl) idEl.textContent = body.key_id;
    $('newkey').hidden = false;
    for (const el of document.querySelectorAll('[data-snippet]')) {
      el.textContent = el.textContent.split(PLACEHOLDER).join(body.api_key);
    }
    const tbody = document.querySelector('#keys tbody');
    const tr = document.createElement('tr');
    tr.dataset.key = body.key_id;
    const cells = [body.key_id, body.created, 'never'];
    cells.forEach((text, i) => {
      const td = document.createElement('td');
      if (i === 0) {
        const c = document.createElement('code');
        c.textContent = text;
        td.appendChild(c);
      } else {
        td.textContent = text;
      }
      tr.appendChild(td);
    });
    const td = document.createElement('td');
    const a = document.createElement('a');
    a.className = 'btn btn-ghost';
    a.href = '/dashboard/keys/' + encodeURIComponent(body.key_id) + '/revoke';
    a.id = 'revoke-' + body.key_id;
    a.textContent = 'Revoke';
    td.appendChild(a);
    tr.appendChild(td);
    const empty = tbody.querySelector('td[colspan]');
    if (empty) empty.parentElement.remove();
    tbody.appendChild(tr);
    // The heading's count follows the table, not the page as first served.
    const active = $('active-keys');
    if (active) active.textContent = String(tbody.querySelectorAll('tr[data-key]').length);
  });
})();
