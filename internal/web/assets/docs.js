// Vertal Run docs: show this server's URL where the reference says "Base
// URL", and give code blocks a copy button. Text only; no markup from strings.
'use strict';

(function () {
  for (const el of document.querySelectorAll('[data-origin]')) {
    el.textContent = location.origin;
  }
  for (const pre of document.querySelectorAll('.prose pre')) {
    const wrap = document.createElement('div');
    wrap.className = 'pre-wrap';
    pre.replaceWith(wrap);
    const btn = document.createElement('button');
    btn.type = 'button';
    btn.className = 'btn btn-ghost btn-copy';
    btn.textContent = 'Copy';
    btn.setAttribute('aria-label', 'Copy code');
    btn.addEventListener('click', async () => {
      try {
        await navigator.clipboard.writeText(pre.textContent);
        btn.textContent = 'Copied';
      } catch (e) {
        btn.textContent = 'Select and copy';
      }
      setTimeout(() => { btn.textContent = 'Copy'; }, 1600);
    });
    wrap.append(pre, btn);
  }
})();
