// Checks a Vertal Run MCP server with the official TypeScript MCP client.
//
//   node check.mjs stdio COMMAND [ARG...]   (KUBO_API_URL / KUBO_API_KEY pass through)
//   node check.mjs http URL KEY [files]     (Streamable HTTP, Authorization: Bearer KEY)
//
// With stdio, MCPCHECK_FILES=1 in the environment does what "files" does for http;
// MCPCHECK_SANDBOXES=1 requires the sandbox tools, in either mode. MCPCHECK_NETWORK=1
// (for a key whose plan may reach allowed.test and *.allowed.test) also gives
// create_sandbox a network: a narrower one is the sandbox's, a wider one is refused.
//
// It lists the tools, runs print(6*7) and expects 42, runs a failing
// program and expects a tool error (not a protocol error), and reads the
// usage. With "files" it also sends a CSV and gets back a PNG the program
// wrote (as image content) and a CSV (as an embedded text resource). It
// prints one JSON line with what it saw and exits 0 on success.
import { Client } from '@modelcontextprotocol/sdk/client/index.js';
import { StdioClientTransport } from '@modelcontextprotocol/sdk/client/stdio.js';
import { StreamableHTTPClientTransport } from '@modelcontextprotocol/sdk/client/streamableHttp.js';

function fail(msg, detail) {
  console.error(`mcpclient: ${msg}`);
  if (detail !== undefined) console.error(JSON.stringify(detail, null, 2));
  process.exit(1);
}

function textOf(result) {
  return (result.content ?? []).filter((c) => c.type === 'text').map((c) => c.text).join('\n');
}

const [mode, ...rest] = process.argv.slice(2);
let transport;
if (mode === 'stdio' && rest.length >= 1) {
  // The SDK passes only a few variables to the child by default; the
  // server needs KUBO_API_URL and KUBO_API_KEY.
  transport = new StdioClientTransport({ command: rest[0], args: rest.slice(1), env: { ...process.env }, stderr: 'inherit' });
} else if (mode === 'http' && (rest.length === 2 || (rest.length === 3 && rest[2] === 'files'))) {
  transport = new StreamableHTTPClientTransport(new URL(rest[0]), {
    requestInit: { headers: { Authorization: `Bearer ${rest[1]}` } },
  });
} else {
  fail('usage: node check.mjs stdio COMMAND [ARG...] | node check.mjs http URL KEY [files]');
}

const client = new Client({ name: 'vertal-mcpclient-check', version: '1.0.0' });
const timer = setTimeout(() => fail('timed out after 120 s'), 120_000);
try {
  await client.connect(transport);
  const server = client.getServerVersion();

  const { tools } = await client.listTools();
  const names = tools.map((t) => t.name).sort();
  // A server whose API has sandboxes that stay also lists their tools (the
  // API server's /mcp, vertal mcp and python -m vertal2kubo.mcp).
  // MCPCHECK_SANDBOXES=1 requires them.
  const sandboxTools = ['create_sandbox', 'get_usage', 'kill_sandbox', 'list_files', 'pause_sandbox', 'read_file', 'resume_sandbox', 'run_code', 'run_command', 'write_file'];
  const withSandboxes = JSON.stringify(names) === JSON.stringify(sandboxTools);
  if (process.env.MCPCHECK_SANDBOXES === '1' && !withSandboxes) fail('the sandbox tools are missing', names);
  if (!withSandboxes && JSON.stringify(names) !== JSON.stringify(['get_usage', 'run_code'])) fail('unexpected tools', names);
  const runCode = tools.find((t) => t.name === 'run_code');
  for (const phrase of ['no network', 'cannot be installed', '16 MB', '64 KB']) {
    if (!runCode.description.includes(phrase)) fail(`run_code description lacks "${phrase}"`, runCode.description);
  }

  const ok = await client.callTool({ name: 'run_code', arguments: { language: 'python', code: 'print(6*7)' } });
  if (ok.isError || !textOf(ok).includes('42') || ok.structuredContent?.stdout !== '42\n') fail('run_code print(6*7) did not give 42', ok);

  const bad = await client.callTool({ name: 'run_code', arguments: { language: 'python', code: 'import sys; sys.exit(3)' } });
  if (!bad.isError || bad.structuredContent?.exit_code !== 3 || bad.structuredContent?.status !== 'failed') {
    fail('a failing program should be a tool error carrying exit code 3', bad);
  }

  let files = null;
  if (mode === 'http' ? rest[2] === 'files' : process.env.MCPCHECK_FILES === '1') {
    // A PNG written with the standard library only, and the CSV doubled.
    const code = [
      'import struct, sys, zlib',
      'def chunk(t, d): return struct.pack(">I", len(d)) + t + d + struct.pack(">I", zlib.crc32(t + d) & 0xffffffff)',
      'raw = b"".join(b"\\x00" + b"\\x10\\x20\\x30" * 2 for _ in range(2))',
      'open("plot.png", "wb").write(b"\\x89PNG\\r\\n\\x1a\\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", 2, 2, 8, 2, 0, 0, 0)) + chunk(b"IDAT", zlib.compress(raw)) + chunk(b"IEND", b""))',
      'rows = open("in/data.csv").read().splitlines()',
      'open("out.csv", "w").write("\\n".join(rows * 2) + "\\n")',
      'print(len(rows), sys.argv[1:])',
    ].join('\n');
    const res = await client.callTool({ name: 'run_code', arguments: {
      language: 'python', code, files: [{ path: 'in/data.csv', content: 'a,b\n1,2\n' }], args: ['x'],
      return_files: ['*.png', '*.csv'],
    } });
    const image = (res.content ?? []).find((c) => c.type === 'image');
    const resource = (res.content ?? []).find((c) => c.type === 'resource');
    const png = image ? Buffer.from(image.data, 'base64') : Buffer.alloc(0);
    if (res.isError || !image || image.mimeType !== 'image/png' || png.readUInt32BE(0) !== 0x89504e47 ||
        !resource || !resource.resource.uri.endsWith('/files/out.csv') || resource.resource.text !== 'a,b\n1,2\na,b\n1,2\n' ||
        !textOf(res).includes("2 ['x']") || !textOf(res).includes('files: out.csv')) {
      fail('run_code with files did not give back the PNG and the CSV', res);
    }
    files = { image: image.mimeType, resource: resource.resource.uri };
  }

  let sandbox = null;
  if (withSandboxes) {
    // State carries across calls: a file written is there for a command.
    const created = await client.callTool({ name: 'create_sandbox', arguments: {} });
    const id = created.structuredContent?.id;
    if (created.isError || !id?.startsWith('sbx_')) fail('create_sandbox failed', created);
    const wrote = await client.callTool({ name: 'write_file', arguments: { sandbox_id: id, path: 'hello.txt', content: 'hi from ts\n' } });
    if (wrote.isError) fail('write_file failed', wrote);
    const cat = await client.callTool({ name: 'run_command', arguments: { sandbox_id: id, cmd: 'cat hello.txt && echo more >> hello.txt' } });
    if (cat.isError || cat.structuredContent?.stdout !== 'hi from ts\n') fail('run_command did not see the file written', cat);
    const read = await client.callTool({ name: 'read_file', arguments: { sandbox_id: id, path: 'hello.txt' } });
    if (read.isError || read.structuredContent?.content !== 'hi from ts\nmore\n') fail('read_file did not see the command\'s write', read);
    // run_code with the sandbox_id: cells that keep their state across
    // three calls, and a value with a PNG form that comes back as an image.
    const cell = (code) => client.callTool({ name: 'run_code', arguments: { sandbox_id: id, language: 'python', code } });
    const c1 = await cell('rows = open("hello.txt").read().splitlines()');
    if (c1.isError) fail('run_code cell 1 failed', c1);
    const c2 = await cell('rows.append("third")\nlen(rows)');
    if (c2.isError || !textOf(c2).includes('--- result ---\n3\n')) fail('run_code cell 2 did not see cell 1\'s rows', c2);
    const png = [
      'import struct, zlib',
      'def chunk(t, d): return struct.pack(">I", len(d)) + t + d + struct.pack(">I", zlib.crc32(t + d) & 0xffffffff)',
      'class Chart:',
      '    def _repr_png_(self):',
      '        raw = b"".join(b"\\x00" + b"\\x10\\x20\\x30" * len(rows) for _ in range(2))',
      '        return b"\\x89PNG\\r\\n\\x1a\\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", len(rows), 2, 8, 2, 0, 0, 0)) + chunk(b"IDAT", zlib.compress(raw)) + chunk(b"IEND", b"")',
      'Chart()',
    ].join('\n');
    const c3 = await cell(png);
    const chart = (c3.content ?? []).find((c) => c.type === 'image');
    const chartPNG = chart ? Buffer.from(chart.data, 'base64') : Buffer.alloc(0);
    if (c3.isError || !chart || chart.mimeType !== 'image/png' || chartPNG.readUInt32BE(0) !== 0x89504e47 || chartPNG.readUInt32BE(16) !== 3 ||
        c3.structuredContent?.execution_count !== 3 || !c3.structuredContent?.context_id?.startsWith('ctx_')) {
      fail('run_code cell 3 did not give back the chart of the three rows as an image', c3);
    }
    const killed = await client.callTool({ name: 'kill_sandbox', arguments: { sandbox_id: id } });
    if (killed.isError || killed.structuredContent?.status !== 'ended') fail('kill_sandbox failed', killed);
    const after = await client.callTool({ name: 'run_command', arguments: { sandbox_id: id, cmd: 'true' } });
    if (!after.isError || !textOf(after).includes('sandbox_not_running')) fail('run_command in a killed sandbox should be a sandbox_not_running tool error', after);
    sandbox = { id, stdout: cat.structuredContent.stdout, cells: c3.structuredContent.execution_count, chart: chart.mimeType };
  }

  let network = null;
  if (process.env.MCPCHECK_NETWORK === '1') {
    if (!withSandboxes) fail('MCPCHECK_NETWORK needs the sandbox tools', names);
    const create = tools.find((t) => t.name === 'create_sandbox');
    if (!create.inputSchema?.properties?.network || create.description.includes('has no network access')) {
      fail('create_sandbox does not take network, or says the sandbox has no network', create);
    }
    const narrow = await client.callTool({ name: 'create_sandbox', arguments: { network: ['api.allowed.test'], timeout_s: 60 } });
    const allow = narrow.structuredContent?.limits?.network?.allow;
    if (narrow.isError || JSON.stringify(allow) !== '["api.allowed.test"]' || !textOf(narrow).includes('network: allowed api.allowed.test')) {
      fail('create_sandbox with network ["api.allowed.test"] did not get that list', narrow);
    }
    // A fetch beyond the sandbox's list (within the plan's) is refused by
    // the proxy, and run_command's answer names it: every server reads
    // the sandbox's record (the stdio ones over the API, /mcp from the
    // service).
    const fetch = await client.callTool({ name: 'run_command', arguments: { sandbox_id: narrow.structuredContent.id, timeout_s: 30,
      cmd: "python3 -c \"import urllib.request; urllib.request.urlopen('https://beyond.allowed.test/', timeout=10)\"" } });
    if (!fetch.isError) fail('a fetch beyond the sandbox\'s list succeeded', fetch);
    if (!/\nnetwork: 1 connection\(s\) refused while it ran\nrefused: beyond\.allowed\.test:443 \(tls\): \S/.test(textOf(fetch))) {
      fail('run_command did not name the connection refused while it ran', fetch);
    }
    const gone = await client.callTool({ name: 'kill_sandbox', arguments: { sandbox_id: narrow.structuredContent.id } });
    if (gone.isError) fail('kill_sandbox of the sandbox with a network failed', gone);
    const wide = await client.callTool({ name: 'create_sandbox', arguments: { network: ['evil.test'] } });
    // The service's words are its own; the code, the host and the plan's
    // list in them are what this checks.
    if (!wide.isError || !/forbidden: network\.allow.*evil\.test.*allowed\.test/.test(textOf(wide)) ||
        !textOf(wide).includes('leave network out for the plan\'s whole list')) {
      fail('create_sandbox with a host beyond the plan should be a forbidden tool error naming the plan\'s list', wide);
    }
    network = { allow, refused: textOf(wide) };
  }

  const usage = await client.callTool({ name: 'get_usage', arguments: {} });
  if (usage.isError || typeof usage.structuredContent?.limits?.max_timeout_s !== 'number') fail('get_usage failed', usage);

  console.log(JSON.stringify({
    ok: true,
    server,
    tools: names,
    stdout: ok.structuredContent.stdout,
    failedExitCode: bad.structuredContent.exit_code,
    files,
    sandbox,
    network,
    executionsToday: usage.structuredContent.today.executions,
  }));
} catch (err) {
  fail(`protocol error: ${err?.stack ?? err}`);
} finally {
  clearTimeout(timer);
  await client.close().catch(() => {});
}
