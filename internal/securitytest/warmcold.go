package securitytest

// Program is user code whose outcome a warm sandbox must reproduce
// exactly, as the cold path gives it.
type Program struct {
	Name, Lang, Code string
}

// ChildPrograms start worker threads and child processes: each must run
// only its own code, on the warm path exactly as on the cold one. The warm
// node launcher is preloaded into every worker thread, where the main
// module's path holds the user's code by then, which ran once more in each
// worker (issue 20). The drivers' warm-equals-cold tests and the
// launcher's own run them.
func ChildPrograms() []Program {
	return []Program{
		{Name: "worker_threads", Lang: "javascript", Code: "const { Worker, isMainThread, parentPort, workerData } = require('worker_threads');\nconst seen = [isMainThread, process.execArgv, Object.keys(require.cache)];\nif (isMainThread) {\n  console.log('main', JSON.stringify(seen));\n  const got = [];\n  let exited = 0;\n  for (let i = 0; i < 4; i++) {\n    const w = new Worker(__filename, { workerData: i });\n    w.on('message', (m) => got.push(m));\n    w.on('exit', () => { if (++exited === 4) console.log(got.length, JSON.stringify(got.sort())); });\n  }\n} else {\n  parentPort.postMessage(JSON.stringify([workerData, ...seen]));\n}\n"},
		{Name: "worker_eval", Lang: "javascript", Code: "const { Worker, isMainThread } = require('worker_threads');\nconsole.log('main start, isMainThread=' + isMainThread);\nnew Worker(\"require('worker_threads').parentPort.postMessage(6 * 7)\", { eval: true })\n  .on('message', (m) => console.log('worker said', m));\n"},
		{Name: "fork", Lang: "javascript", Code: "const cp = require('child_process');\nif (process.send) {\n  process.send([process.argv.slice(1), process.execArgv, Object.keys(require.cache)]);\n} else {\n  console.log('parent', JSON.stringify(process.execArgv));\n  cp.fork(__filename, ['x']).on('message', (m) => console.log('child', JSON.stringify(m)));\n}\n"},
		{Name: "multiprocessing_spawn", Lang: "python", Code: "import multiprocessing as mp, sys\nprint('top', __name__, flush=True)\ndef child(conn):\n    conn.send([__name__, sys.argv, sys.flags.no_site])\n    conn.close()\nif __name__ == '__main__':\n    mp.set_start_method('spawn')\n    a, b = mp.Pipe()\n    p = mp.Process(target=child, args=(b,))\n    p.start()\n    print(a.recv(), flush=True)\n    p.join()\n    print('exit', p.exitcode)\n"},
		{Name: "multiprocessing_fork", Lang: "python", Code: "import multiprocessing as mp, sys\nprint('top', __name__, flush=True)\ndef child(conn):\n    conn.send([__name__, sys.argv, sys.flags.no_site])\n    conn.close()\nif __name__ == '__main__':\n    mp.set_start_method('fork')\n    a, b = mp.Pipe()\n    p = mp.Process(target=child, args=(b,))\n    p.start()\n    print(a.recv(), flush=True)\n    p.join()\n    print('exit', p.exitcode)\n"},
	}
}
