'use strict';
// Vertal Run warm-pool launcher. Node preloads it (--require) from a
// read-only file of its own, so it runs once the runtime has booted and
// before the main module is loaded. It announces that node is up, waits
// for the host's go line, and then lets node load /code/main.js (which the
// host has meanwhile written) as the main module, exactly as the cold path
// does. It leaves no module, cache entry or option behind.
//
// Node preloads it again in every worker thread (a worker inherits the
// process's --require): there it only removes itself, and the worker runs
// its own code, as on the cold path. A worker is told apart by a module
// node loads in workers only, so nothing is loaded to ask.
(function () {
  const forget = () => {
    delete require.cache[__filename];
    const i = process.execArgv.indexOf('--require');
    if (i >= 0) process.execArgv.splice(i, 2);
  };
  if (process.moduleLoadList.includes('NativeModule internal/process/worker_thread_only')) {
    forget();
    return;
  }
  const fs = require('fs');
  fs.writeSync(1, '\0vertal-ready\0');
  const b = Buffer.alloc(1);
  let line = '';
  for (;;) {
    let n;
    try {
      n = fs.readSync(0, b, 0, 1, null);
    } catch (e) {
      if (e.code === 'EAGAIN') {
        Atomics.wait(new Int32Array(new SharedArrayBuffer(4)), 0, 0, 1);
        continue;
      }
      throw e;
    }
    if (n === 0) process.reallyExit(111);
    if (b[0] === 10) break;
    line += String.fromCharCode(b[0]);
  }
  if (line === '0') {
    // No stdin: make fd 0 /dev/null, as it is on the cold path. The
    // lowest free descriptor is reused, so the open lands on 0.
    fs.closeSync(0);
    const fd = fs.openSync('/dev/null', 'r');
    if (fd !== 0) process.reallyExit(112);
  }
  forget();
})();
