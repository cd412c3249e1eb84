// Vertal Run's JavaScript kernel: one code context of a sandbox (see
// internal/sandboxes/contexts.go). It reads one JSON request per line on
// stdin and answers on stdout, each message one line starting with the
// marker "\x1evtl:"; anything else on fd 1 (a child process) is the
// cell's raw stdout. Cells run in this process's global scope: top-level
// let, const, class and function declarations become globals (so a cell
// may be run again), and top-level await works. It is run as
// node --expose-internals -e for Node's own acorn parser.
'use strict';
const fs = require('fs');
const util = require('util');
const vm = require('vm');
const acorn = require('internal/deps/acorn/acorn/dist/acorn');
const MARK = '\x1evtl:';
const send = (m) => {
  const b = Buffer.from(MARK + JSON.stringify(m) + '\n');
  for (let off = 0; off < b.length;) {
    try {
      off += fs.writeSync(1, b, off);
    } catch (e) {
      if (e.code !== 'EAGAIN') throw e;
    }
  }
};
for (const name of ['stdout', 'stderr']) {
  process[name].write = (chunk, enc, cb) => {
    const s = typeof chunk === 'string' ? chunk : Buffer.from(chunk).toString();
    for (let i = 0; i < s.length; i += 65536) send({t: name, d: s.slice(i, i + 65536)});
    if (typeof enc === 'function') enc(); else if (typeof cb === 'function') cb();
    return true;
  };
}
globalThis.require = require;
globalThis.module = module;

// transform rewrites a cell into an async function body whose top-level
// declarations assign globals and whose last expression is returned.
function transform(code) {
  const ast = acorn.parse(code, {ecmaVersion: 'latest', sourceType: 'script', allowAwaitOutsideFunction: true,
    allowReturnOutsideFunction: false, locations: false});
  const edits = []; // [start, end, text]
  const names = [];
  const collect = (p) => {
    if (!p) return;
    switch (p.type) {
      case 'Identifier': names.push(p.name); break;
      case 'ObjectPattern': p.properties.forEach((q) => collect(q.type === 'RestElement' ? q.argument : q.value)); break;
      case 'ArrayPattern': p.elements.forEach(collect); break;
      case 'RestElement': collect(p.argument); break;
      case 'AssignmentPattern': collect(p.left); break;
    }
  };
  const body = ast.body;
  body.forEach((st, i) => {
    if (st.type === 'VariableDeclaration') {
      st.declarations.forEach((d) => collect(d.id));
      const parts = st.declarations.filter((d) => d.init).map((d) =>
        '(' + code.slice(d.id.start, d.id.end) + ' = ' + code.slice(d.init.start, d.init.end) + ')');
      edits.push([st.start, st.end, (parts.length ? 'void (' + parts.join(', ') + ');' : ';')]);
    } else if (st.type === 'FunctionDeclaration') {
      names.push(st.id.name);
    } else if (st.type === 'ClassDeclaration') {
      names.push(st.id.name);
      edits.push([st.start, st.end, st.id.name + ' = ' + code.slice(st.start, st.end) + ';']);
    } else if (i === body.length - 1 && st.type === 'ExpressionStatement') {
      edits.push([st.start, st.end, 'return {value: (' + code.slice(st.expression.start, st.expression.end) + ')};']);
    }
  });
  let out = code;
  edits.sort((a, b) => b[0] - a[0] || b[1] - a[1]);
  for (const [s, e, t] of edits) out = out.slice(0, s) + t + out.slice(e);
  // Function declarations are hoisted inside the wrapper; publish them first.
  const fns = body.filter((st) => st.type === 'FunctionDeclaration')
    .map((st) => 'globalThis[' + JSON.stringify(st.id.name) + '] = ' + st.id.name + ';').join('');
  const decl = names.filter((n) => !body.some((st) => st.type === 'FunctionDeclaration' && st.id.name === n));
  return {pre: decl.length ? 'var ' + [...new Set(decl)].join(', ') + ';' : '', body: '(async () => {' + fns + '\n' + out + '\n})()'};
}

function bundle(v) {
  const d = {'text/plain': typeof v === 'string' ? util.inspect(v) : util.inspect(v, {depth: 4, colors: false})};
  if (v && typeof v === 'object') {
    for (const [mime, meth] of [['text/html', '_repr_html_'], ['image/png', '_repr_png_'], ['image/svg+xml', '_repr_svg_']]) {
      if (typeof v[meth] === 'function') {
        try { const r = v[meth](); if (r != null) d[mime] = Buffer.isBuffer(r) ? r.toString('base64') : String(r); } catch (e) {}
      }
    }
  }
  return d;
}

function error(e) {
  if (e instanceof Error || (e && typeof e === 'object' && 'stack' in e)) {
    const stack = String(e.stack || '').split('\n').filter((l) => !l.includes('[eval]') && !l.includes('node:')).join('\n');
    send({t: 'error', name: e.name || 'Error', value: e.message === undefined ? String(e) : String(e.message), traceback: stack});
  } else {
    send({t: 'error', name: 'Error', value: 'Uncaught ' + util.inspect(e), traceback: ''});
  }
}

let count = 0;
let interrupt = null; // rejects the running cell's await on SIGINT
process.on('SIGINT', () => { if (interrupt) interrupt(); });
process.on('uncaughtException', (e) => error(e));
process.on('unhandledRejection', (e) => error(e));

async function cell(req) {
  count++;
  const saved = {};
  for (const [k, v] of Object.entries(req.env || {})) { saved[k] = process.env[k]; process.env[k] = v; }
  try {
    let t;
    try {
      t = transform(req.code);
    } catch (e) {
      if (e instanceof SyntaxError) {
        send({t: 'error', name: 'SyntaxError', value: e.message, traceback: 'SyntaxError: ' + e.message});
        return;
      }
      throw e;
    }
    if (t.pre) vm.runInThisContext(t.pre, {filename: 'cell'});
    const p = vm.runInThisContext(t.body, {filename: 'cell', breakOnSigint: true});
    const stop = new Promise((_, reject) => {
      interrupt = () => { const e = new Error('Script execution was interrupted'); e.name = 'Interrupted'; reject(e); };
    });
    const r = await Promise.race([p, stop]);
    if (r && r.value !== undefined) send({t: 'result', main: true, data: bundle(r.value)});
  } catch (e) {
    error(e);
  } finally {
    interrupt = null;
    for (const [k, v] of Object.entries(saved)) { if (v === undefined) delete process.env[k]; else process.env[k] = v; }
    send({t: 'end', n: req.n, count});
  }
}

let buf = '';
let queue = Promise.resolve();
process.stdin.setEncoding('utf8');
process.stdin.on('data', (s) => {
  buf += s;
  let i;
  while ((i = buf.indexOf('\n')) >= 0) {
    const line = buf.slice(0, i);
    buf = buf.slice(i + 1);
    if (!line.trim()) continue;
    let req;
    try { req = JSON.parse(line); } catch (e) { continue; }
    queue = queue.then(() => cell(req));
  }
});
process.stdin.on('end', () => queue.then(() => process.exit(0)));
send({t: 'ready', pid: process.pid});
