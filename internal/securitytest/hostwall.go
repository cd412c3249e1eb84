package securitytest

import (
	"bytes"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kuboprotocol/vertal2kubo/internal/engine"
)

// hostWallCases prove that a request's env and args reach only the
// program inside the sandbox, never a process in the host's namespaces
// (bwrap's parent, a runtime, a shim), where the host's dynamic loader
// would act on them. They set loader names the API refuses, through the
// driver directly: the wall must hold below validation too.
func hostWallCases(e *env) []Case {
	marker := "vertalwall" + randHex(8)
	fakeroot := "/usr/lib/x86_64-linux-gnu/libfakeroot/libfakeroot-tcp.so"
	var cs []Case
	scanned := false
	var hits []string
	cs = append(cs, Case{
		Name: "env_args_not_on_host_processes", Lang: "python",
		Env:  map[string]string{"WALL_ENV": marker + "env"},
		Args: []string{marker + "arg"},
		Code: "import os, sys, time\nprint(sys.argv[1:], os.environ.get('WALL_ENV'), flush=True)\ntime.sleep(4)",
		Output: func(s engine.Stream, b []byte) {
			if s != engine.Stdout || scanned {
				return
			}
			scanned = true
			hits = hostProcsHolding(marker)
		},
		Check: func(t *testing.T, res engine.Result, err error) {
			wantStatus(t, res, err, engine.StatusSucceeded, 0)
			wantContains(t, res.Stdout, "['"+marker+"arg'] "+marker+"env")
			if len(hits) > 0 {
				t.Errorf("host processes hold the request's env or args: %s", strings.Join(hits, "; "))
			}
			if !scanned {
				t.Errorf("the host's processes were not scanned while the program ran")
			}
		},
	})
	shm := "/dev/shm/" + marker
	cs = append(cs, Case{
		Name: "ld_debug_output_leaves_no_host_file", Lang: "bash", Code: "true",
		Env: map[string]string{"LD_DEBUG": "all", "LD_DEBUG_OUTPUT": shm},
		Check: func(t *testing.T, res engine.Result, err error) {
			if err != nil {
				t.Fatalf("err = %v", err)
			}
			for _, g := range []string{shm + "*", "/tmp/" + marker + "*"} {
				if m, _ := filepath.Glob(g); len(m) > 0 {
					t.Errorf("the loader wrote host files %v", m)
					for _, f := range m {
						os.Remove(f)
					}
				}
			}
		},
	})
	if ln, err := net.Listen("tcp", "127.0.0.1:0"); err == nil {
		_, port, _ := net.SplitHostPort(ln.Addr().String())
		cs = append(cs, Case{
			Name: "ld_preload_fakeroot_tcp_no_host_connect", Lang: "bash", Code: "true",
			Env: map[string]string{"LD_PRELOAD": fakeroot, "FAKEROOTKEY": port},
			Check: func(t *testing.T, res engine.Result, err error) {
				defer ln.Close()
				if _, serr := os.Stat(fakeroot); serr != nil {
					t.Fatalf("%s: %v (apt-get install fakeroot: the attack needs the stock host library)", fakeroot, serr)
				}
				_ = ln.(*net.TCPListener).SetDeadline(time.Now())
				if c, aerr := ln.Accept(); aerr == nil {
					c.Close()
					t.Errorf("a process connected from the host's network namespace to 127.0.0.1:%s (LD_PRELOAD reached a host process)", port)
				}
			},
		})
	}
	return cs
}

// hostProcsHolding lists processes in the host's pid namespace (the
// test's own) whose command line or environment contains marker.
func hostProcsHolding(marker string) []string {
	self, _ := os.Readlink("/proc/self/ns/pid")
	dirs, _ := filepath.Glob("/proc/[0-9]*")
	var hits []string
	for _, dir := range dirs {
		if ns, err := os.Readlink(dir + "/ns/pid"); err != nil || ns != self {
			continue
		}
		for _, f := range []string{"cmdline", "environ"} {
			b, err := os.ReadFile(dir + "/" + f)
			if err == nil && bytes.Contains(b, []byte(marker)) {
				hits = append(hits, dir+"/"+f+": "+string(bytes.ReplaceAll(b, []byte{0}, []byte{' '})))
			}
		}
	}
	return hits
}
