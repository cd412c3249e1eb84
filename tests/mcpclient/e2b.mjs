// Runs E2B's own documented flows, with E2B's official SDKs (`e2b` and
// `@e2b/code-interpreter`, pinned in package.json, unmodified), against
// Vertal Run's E2B-compatible API:
//
//   E2B_API_URL=<base>/e2b E2B_SANDBOX_URL=<base>/e2b E2B_API_KEY=<key> \
//   E2B_OTHER_KEY=<another tenant's key> VERTAL_PORT=<the server's port> \
//   node e2b.mjs sdk|interpreter
//
// Each check prints "ok <name>" when it passes; the first failure prints
// its error and exits 1. The Go test (e2b_test.go) requires every name.
import assert from 'node:assert/strict';
import { randomBytes } from 'node:crypto';
import { Sandbox, CommandExitError, AuthenticationError, NotFoundError, ALL_TRAFFIC } from 'e2b';
import { Sandbox as CodeSandbox } from '@e2b/code-interpreter';

const base = process.env.E2B_API_URL;
const otherKey = process.env.E2B_OTHER_KEY;
const port = process.env.VERTAL_PORT;

async function check(name, fn) {
  try {
    await fn();
    console.log(`ok ${name}`);
  } catch (err) {
    console.error(`FAIL ${name}: ${err?.stack ?? err}`);
    if (err?.stdout !== undefined) console.error(`stdout: ${JSON.stringify(err.stdout)} stderr: ${JSON.stringify(err.stderr)}`);
    process.exit(1);
  }
}

// rejects runs fn and returns what it threw, failing if it did not.
async function rejects(fn) {
  try {
    await fn();
  } catch (err) {
    return err;
  }
  assert.fail('expected an error');
}

// untilFile is shell that prints "ready", then waits for path to appear:
// the test writes it only once it has seen "ready", so the command can
// end only if its output streamed before its end.
const waitFor = (path) => `echo ready; for i in $(seq 1 300); do [ -f ${path} ] && break; sleep 0.1; done; [ -f ${path} ] && echo done`;

async function sdk() {
  let sbx;
  await check('create', async () => {
    sbx = await Sandbox.create({ metadata: { suite: 'e2b sdk&=1' }, envs: { GREETING: 'hello' }, timeoutMs: 120_000 });
    assert.match(sbx.sandboxId, /^sbx_[0-9a-f]+$/);
  });
  await check('run stdout stderr exit', async () => {
    const r = await sbx.commands.run('echo "$GREETING out"; echo err >&2; pwd; echo "$USER"');
    assert.equal(r.exitCode, 0);
    assert.equal(r.stdout, 'hello out\n/home/user\nuser\n');
    assert.equal(r.stderr, 'err\n');
  });
  await check('CommandExitError', async () => {
    const err = await rejects(() => sbx.commands.run('echo partial; exit 3'));
    assert.ok(err instanceof CommandExitError, `got ${err?.constructor?.name}: ${err}`);
    assert.equal(err.exitCode, 3);
    assert.equal(err.stdout, 'partial\n');
  });
  await check('onStdout streams before the end', async () => {
    let seen = '';
    const r = await sbx.commands.run(waitFor('/home/user/go-stream'), {
      timeoutMs: 30_000,
      onStdout: async (d) => {
        seen += d;
        if (seen.includes('ready') && !seen.includes('sent')) {
          seen += 'sent';
          await sbx.files.write('/home/user/go-stream', 'x');
        }
      },
    });
    assert.equal(r.stdout, 'ready\ndone\n');
  });
  await check('run with cwd and envs', async () => {
    const r = await sbx.commands.run('echo "$A" && pwd', { cwd: '/tmp', envs: { A: 'set' } });
    assert.equal(r.stdout, 'set\n/tmp\n');
  });
  await check('background list kill', async () => {
    const h = await sbx.commands.run('sleep 60', { background: true });
    assert.ok(h.pid > 0);
    const running = await sbx.commands.list();
    assert.ok(running.some((p) => p.pid === h.pid), `pid ${h.pid} not listed: ${JSON.stringify(running)}`);
    assert.equal(await h.kill(), true);
    const after = await sbx.commands.list();
    assert.ok(!after.some((p) => p.pid === h.pid), 'killed command still listed');
    const err = await rejects(() => h.wait());
    assert.ok(err instanceof CommandExitError, `wait after kill: ${err}`);
    assert.equal(await sbx.commands.kill(h.pid), false);
  });
  await check('stdin', async () => {
    const h = await sbx.commands.run('cat', { background: true, stdin: true });
    await sbx.commands.sendStdin(h.pid, 'hello stdin\n');
    await sbx.commands.closeStdin(h.pid);
    const r = await h.wait();
    assert.equal(r.stdout, 'hello stdin\n');
  });
  await check('connect to a running command', async () => {
    const h = await sbx.commands.run('echo one; sleep 1; echo two', { background: true });
    const again = await sbx.commands.connect(h.pid);
    const r = await again.wait();
    assert.equal(r.stdout, 'one\ntwo\n');
  });
  await check('files text', async () => {
    const info = await sbx.files.write('notes/a.txt', 'text file\n');
    assert.equal(info.path, '/home/user/notes/a.txt');
    assert.equal(await sbx.files.read('/home/user/notes/a.txt'), 'text file\n');
  });
  await check('files binary 70 kB', async () => {
    const data = randomBytes(70 * 1024);
    await sbx.files.write('/home/user/blob.bin', new Uint8Array(data).buffer);
    const got = await sbx.files.read('/home/user/blob.bin', { format: 'bytes' });
    assert.equal(Buffer.from(got).compare(data), 0);
    const r = await sbx.commands.run('sha256sum blob.bin');
    const want = (await import('node:crypto')).createHash('sha256').update(data).digest('hex');
    assert.equal(r.stdout.split(' ')[0], want);
  });
  await check('files write many', async () => {
    const infos = await sbx.files.write([{ path: '/home/user/m/1.txt', data: 'one' }, { path: '/home/user/m/2.txt', data: 'two' }]);
    assert.deepEqual(infos.map((i) => i.path).sort(), ['/home/user/m/1.txt', '/home/user/m/2.txt']);
    assert.equal(await sbx.files.read('/home/user/m/2.txt'), 'two');
  });
  await check('files list exists remove makeDir rename', async () => {
    const list = await sbx.files.list('/home/user/notes');
    assert.deepEqual(list.map((e) => [e.name, e.type]), [['a.txt', 'file']]);
    assert.equal(list[0].size, 10);
    assert.equal(await sbx.files.exists('/home/user/notes/a.txt'), true);
    assert.equal(await sbx.files.exists('/home/user/none.txt'), false);
    assert.equal(await sbx.files.makeDir('/home/user/d1/d2'), true);
    assert.equal(await sbx.files.makeDir('/home/user/d1/d2'), false);
    const moved = await sbx.files.rename('/home/user/notes/a.txt', '/home/user/d1/b.txt');
    assert.equal(moved.path, '/home/user/d1/b.txt');
    await sbx.files.remove('/home/user/d1');
    assert.equal(await sbx.files.exists('/home/user/d1'), false);
    const err = await rejects(() => sbx.files.read('/home/user/none.txt'));
    assert.ok(err instanceof NotFoundError, `read of a missing file: ${err}`);
  });
  await check('watchDir', async () => {
    await sbx.files.makeDir('/home/user/watched');
    const events = [];
    const h = await sbx.files.watchDir('/home/user/watched', (e) => events.push(`${e.type} ${e.name}`));
    const until = async (ev) => {
      for (let i = 0; i < 100 && !events.includes(ev); i++) await new Promise((r) => setTimeout(r, 100));
    };
    await sbx.files.write('/home/user/watched/new.txt', 'x');
    await until('create new.txt');
    await sbx.commands.run('echo more >> watched/new.txt');
    await until('write new.txt');
    await sbx.files.remove('/home/user/watched/new.txt');
    await until('remove new.txt');
    await h.stop();
    assert.deepEqual(events.filter((e) => e.endsWith('new.txt')), ['create new.txt', 'write new.txt', 'remove new.txt']);
  });
  await check('file made by a command', async () => {
    await sbx.commands.run('echo made > made.txt');
    assert.equal(await sbx.files.read('made.txt'), 'made\n');
  });
  await check('read-only root and no root user', async () => {
    const err = await rejects(() => sbx.files.write('/etc/evil', 'x'));
    assert.ok(!(err instanceof NotFoundError), `${err}`);
    const r = await rejects(() => sbx.commands.run('id', { user: 'root' }));
    assert.match(String(r), /root/);
  });
  await check('no network inside', async () => {
    // The server listens on the host's loopback; inside, 127.0.0.1 is the
    // sandbox's own, and there is no other interface to leave by.
    const code = `import socket
print(sorted(n for _, n in socket.if_nameindex()))
s = socket.socket()
s.settimeout(2)
try:
    s.connect(("127.0.0.1", ${port}))
    print("connected")
except OSError as e:
    print("refused", type(e).__name__)`;
    const r = await sbx.commands.run(`python3 -c '${code.replaceAll("'", "'\\''")}'`);
    assert.equal(r.stdout.split('\n')[0], "['lo']");
    assert.match(r.stdout, /^refused /m);
  });
  await check('connect list setTimeout getInfo', async () => {
    const again = await Sandbox.connect(sbx.sandboxId);
    const r = await again.commands.run('cat made.txt');
    assert.equal(r.stdout, 'made\n');
    const page = await Sandbox.list({ query: { metadata: { suite: 'e2b sdk&=1' } } }).nextItems();
    assert.deepEqual(page.map((s) => s.sandboxId), [sbx.sandboxId]);
    assert.equal(page[0].state, 'running');
    assert.equal(await sbx.isRunning(), true);
    const before = await sbx.getInfo();
    await sbx.setTimeout(600_000);
    const after = await Sandbox.getInfo(sbx.sandboxId);
    assert.equal(after.state, 'running');
    assert.equal(after.templateId, 'base');
    assert.deepEqual(after.metadata, { suite: 'e2b sdk&=1' });
    assert.ok(after.endAt > before.endAt, `endAt ${after.endAt} not after ${before.endAt}`);
  });
  await check('getMetrics', async () => {
    const m = await sbx.getMetrics();
    assert.equal(m.length, 1);
    assert.ok(m[0].cpuCount >= 1 && m[0].memTotal > 0 && m[0].memUsed > 0 && m[0].memUsed <= m[0].memTotal, JSON.stringify(m));
  });
  await check('another tenant sees nothing', async () => {
    const err = await rejects(() => Sandbox.connect(sbx.sandboxId, { apiKey: otherKey }));
    assert.ok(err instanceof NotFoundError, `connect with another tenant's key: ${err}`);
    const page = await Sandbox.list({ apiKey: otherKey }).nextItems();
    assert.ok(!page.some((s) => s.sandboxId === sbx.sandboxId));
    assert.equal(await Sandbox.kill(sbx.sandboxId, { apiKey: otherKey }), false);
  });
  await check('data plane refuses a missing or foreign token', async () => {
    const other = await Sandbox.create({ timeoutMs: 60_000 });
    const url = `${base}/files?path=${encodeURIComponent('/home/user/made.txt')}`;
    const hdr = { 'E2b-Sandbox-Id': sbx.sandboxId, 'E2b-Sandbox-Port': '49983' };
    let res = await fetch(url, { headers: hdr });
    assert.equal(res.status, 401);
    res = await fetch(url, { headers: { ...hdr, 'X-Access-Token': other.envdAccessToken ?? 'none' } });
    assert.equal(res.status, 401);
    res = await fetch(url, { headers: { ...hdr, 'X-Access-Token': sbx.envdAccessToken } });
    assert.equal(res.status, 200);
    assert.equal(await res.text(), 'made\n');
    await other.kill();
  });
  await check('pause and connect resumes', async () => {
    assert.equal(await sbx.pause(), true);
    assert.equal((await Sandbox.getInfo(sbx.sandboxId)).state, 'paused');
    const back = await Sandbox.connect(sbx.sandboxId);
    assert.equal((await back.commands.run('cat made.txt')).stdout, 'made\n');
  });
  await check('kill', async () => {
    assert.equal(await sbx.kill(), true);
    const err = await rejects(() => sbx.commands.run('echo after'));
    assert.ok(err, 'ran after kill');
    assert.equal(await Sandbox.kill(sbx.sandboxId), false);
    assert.equal(await sbx.isRunning(), false);
    const gone = await rejects(() => Sandbox.getInfo(sbx.sandboxId));
    assert.ok(gone instanceof NotFoundError, `${gone}`);
  });
  await check('wrong key', async () => {
    const err = await rejects(() => Sandbox.create({ apiKey: 'kubo_sk_' + 'x'.repeat(40) }));
    assert.ok(err instanceof AuthenticationError, `got ${err?.constructor?.name}: ${err}`);
  });
}

async function interpreter() {
  let sbx;
  await check('create code interpreter', async () => {
    sbx = await CodeSandbox.create({ timeoutMs: 300_000 });
  });
  await check('state and last value', async () => {
    await sbx.runCode('x = 41');
    const ex = await sbx.runCode('x + 1');
    assert.equal(ex.text, '42');
    assert.equal(ex.error, undefined);
  });
  await check('stdout logs', async () => {
    const ex = await sbx.runCode('print("hi"); import sys; print("oops", file=sys.stderr)');
    assert.deepEqual(ex.logs.stdout, ['hi\n']);
    assert.deepEqual(ex.logs.stderr, ['oops\n']);
  });
  await check('error name value traceback', async () => {
    const ex = await sbx.runCode('def f():\n    return 1 / 0\nf()');
    assert.equal(ex.error.name, 'ZeroDivisionError');
    assert.equal(ex.error.value, 'division by zero');
    assert.match(ex.error.traceback, /line 2, in f/);
  });
  await check('streams before the end', async () => {
    let ready = false;
    const ex = await sbx.runCode(
      'import os, time\nprint("ready", flush=True)\nfor _ in range(300):\n    if os.path.exists("/home/user/go-cell"): break\n    time.sleep(0.1)\nprint(os.path.exists("/home/user/go-cell"))',
      {
        timeoutMs: 40_000,
        onStdout: async (m) => {
          if (!ready && m.line.includes('ready')) {
            ready = true;
            await sbx.files.write('/home/user/go-cell', 'x');
          }
        },
      },
    );
    assert.deepEqual(ex.logs.stdout, ['ready\n', 'True\n']);
  });
  await check('separate contexts share nothing', async () => {
    const c1 = await sbx.createCodeContext();
    const c2 = await sbx.createCodeContext({ language: 'python' });
    await sbx.runCode('only_here = 5', { context: c1 });
    assert.equal((await sbx.runCode('only_here', { context: c1 })).text, '5');
    const ex = await sbx.runCode('only_here', { context: c2 });
    assert.equal(ex.error?.name, 'NameError');
    const listed = await sbx.listCodeContexts();
    assert.ok(listed.some((c) => c.id === c1.id) && listed.some((c) => c.id === c2.id));
    await sbx.restartCodeContext(c1);
    assert.equal((await sbx.runCode('only_here', { context: c1 })).error?.name, 'NameError');
    await sbx.removeCodeContext(c2);
    const gone = await rejects(() => sbx.runCode('1', { context: c2 }));
    assert.ok(gone, 'ran in a removed context');
  });
  await check('js context keeps state', async () => {
    await sbx.runCode('let a = 2', { language: 'js' });
    assert.equal((await sbx.runCode('a * 21', { language: 'js' })).text, '42');
    const ctx = await sbx.createCodeContext({ language: 'js' });
    assert.equal((await sbx.runCode('typeof a', { context: ctx })).text, "'undefined'");
  });
  await check('matplotlib chart as PNG', async () => {
    const ex = await sbx.runCode('import matplotlib.pyplot as plt\nplt.plot([1, 2, 3], [3, 1, 2])\nplt.show()');
    assert.equal(ex.error, undefined, JSON.stringify(ex.error));
    const png = ex.results.find((r) => r.png);
    assert.ok(png, `no PNG among ${JSON.stringify(ex.results.map((r) => r.formats()))}`);
    assert.equal(Buffer.from(png.png, 'base64').subarray(0, 8).toString('hex'), '89504e470d0a1a0a');
  });
  await check('DataFrame as HTML', async () => {
    const ex = await sbx.runCode('import pandas as pd\npd.DataFrame({"a": [1, 2]})');
    assert.match(ex.results[0].html ?? '', /<table/);
    assert.match(ex.text, /a/);
  });
  await check('kill code interpreter', async () => {
    assert.equal(await sbx.kill(), true);
  });
}

// network runs E2B's network options against a key whose plan allows
// allowed.test and its subdomains (the server's --egress): the sandbox's
// list is the plan's, narrowed by allowOut, or nothing; a wider list is
// refused. Traffic itself is TestEgressE2E's (cmd/vertal), on a fake
// internet this test has no part of.
async function network() {
  const proxyOf = async (sbx) => (await sbx.commands.run('echo "[$HTTPS_PROXY]"')).stdout.trim();
  await check('plan network by default', async () => {
    const sbx = await Sandbox.create({ timeoutMs: 60_000 });
    assert.equal((await sbx.getInfo()).allowInternetAccess, true);
    assert.equal(await proxyOf(sbx), '[http://127.0.0.1:3128]');
    await sbx.kill();
  });
  await check('allowInternetAccess false', async () => {
    const sbx = await Sandbox.create({ allowInternetAccess: false, timeoutMs: 60_000 });
    assert.equal((await sbx.getInfo()).allowInternetAccess, false);
    assert.equal(await proxyOf(sbx), '[]');
    await sbx.kill();
  });
  await check('allowOut narrows', async () => {
    const sbx = await Sandbox.create({ network: { allowOut: ['api.allowed.test'], denyOut: [ALL_TRAFFIC] }, timeoutMs: 60_000 });
    assert.equal((await sbx.getInfo()).allowInternetAccess, true);
    // The proxy answers for the sandbox: a name outside its list is
    // refused there (403), before any lookup.
    const code = `import socket
s = socket.create_connection(("127.0.0.1", 3128), timeout=10)
s.sendall(b"CONNECT allowed.test:443 HTTP/1.1\\r\\nHost: allowed.test:443\\r\\n\\r\\n")
print(s.recv(100).split(b"\\r\\n")[0].decode())`;
    const r = await sbx.commands.run(`python3 -c '${code.replaceAll("'", "'\\''")}'`);
    assert.equal(r.stdout.trim(), 'HTTP/1.1 403 Forbidden');
    await sbx.kill();
  });
  await check('allowOut wider than the plan', async () => {
    const err = await rejects(() => Sandbox.create({ network: { allowOut: ['evil.test'] } }));
    assert.match(String(err?.message ?? err), /your plan does not allow \("evil.test"\)/);
  });
}

const mode = process.argv[2];
if (mode === 'sdk') await sdk();
else if (mode === 'interpreter') await interpreter();
else if (mode === 'network') await network();
else {
  console.error('usage: node e2b.mjs sdk|interpreter|network');
  process.exit(2);
}
