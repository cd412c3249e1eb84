'use strict';
// Vertal Run warm-pool launcher. Node preloads it (--require) with the same
// path as the main module, so it runs once the runtime has booted and
// before the main module is loaded. It announces that node is up, waits
// for the host's go line, and then lets node load /code/main.js (which the
// host has replaced with the user's code) as the main module, exactly as
// the cold path does. It leaves no module, cache entry or option behind.
(function () {
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
  delete require.cache[__filename];
  const i = process.execArgv.indexOf('--require');
  if (i >= 0) process.execArgv.splice(i, 2);
})();
