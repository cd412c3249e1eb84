// Command liveagent stands in for the real agent (cmd/vertal-agent) in
// the oci driver's tests of live sandboxes. Run as `liveagent serve
// --deadline N [--fd N]`, it answers one line-based command per line on stdin with
// one JSON line {"out": ..., "err": ...} on stdout, and exits on EOF:
//
//	id                 uid and gid
//	env                the environment, one NAME=value a line
//	pwd                the working directory
//	read PATH          the file's content
//	write PATH DATA    writes DATA (the rest of the line) to PATH
//	fill DIR N         writes N bytes to DIR in files of 256 KiB
//	sh CMD             /bin/sh -c CMD, its combined output
//	sleep-child ARG    starts /bin/sleep ARG in the background, its pid
//	killkids           SIGKILLs every process but itself and its parent
//	stat PATH          owner uid, gid and permission bits (octal)
//	deadline           the --deadline it was given
package main

import (
	"bufio"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

func main() {
	if len(os.Args) < 2 || os.Args[1] != "serve" {
		fmt.Fprintln(os.Stderr, "usage: liveagent serve --deadline N")
		os.Exit(2)
	}
	fs := flag.NewFlagSet("serve", flag.ExitOnError)
	deadline := fs.Int64("deadline", 0, "unix seconds")
	fd := fs.Int("fd", -1, "the channel's descriptor, instead of stdin and stdout (runc)")
	_ = fs.Parse(os.Args[2:])
	rd, wr := os.Stdin, os.Stdout
	if *fd >= 0 {
		syscall.CloseOnExec(*fd)
		rd = os.NewFile(uintptr(*fd), "channel")
		wr = rd
	}
	if *deadline == 0 {
		fmt.Fprintln(os.Stderr, "liveagent: --deadline is required")
		os.Exit(2)
	}
	// Threads made now stay idle in the runtime's pool: under a full pids
	// limit (a fork bomb) the agent must not need a new one.
	var wg sync.WaitGroup
	for range 8 {
		wg.Add(1)
		go func() { defer wg.Done(); time.Sleep(0); syscall.Nanosleep(&syscall.Timespec{Nsec: 20e6}, nil) }()
	}
	wg.Wait()
	fmt.Fprintln(os.Stderr, "liveagent: serving")
	in := bufio.NewScanner(rd)
	in.Buffer(make([]byte, 1<<20), 1<<20)
	out := json.NewEncoder(wr)
	for in.Scan() {
		o, err := do(in.Text(), *deadline)
		r := struct {
			Out string `json:"out"`
			Err string `json:"err,omitempty"`
		}{Out: o}
		if err != nil {
			r.Err = err.Error()
		}
		if out.Encode(r) != nil {
			return
		}
	}
}

func do(line string, deadline int64) (string, error) {
	cmd, rest, _ := strings.Cut(line, " ")
	switch cmd {
	case "id":
		return fmt.Sprintf("%d %d", os.Getuid(), os.Getgid()), nil
	case "env":
		return strings.Join(os.Environ(), "\n"), nil
	case "pwd":
		return os.Getwd()
	case "read":
		b, err := os.ReadFile(rest)
		return string(b), err
	case "write":
		path, data, _ := strings.Cut(rest, " ")
		return "", os.WriteFile(path, []byte(data), 0o644)
	case "fill":
		dir, n, _ := strings.Cut(rest, " ")
		size, err := strconv.ParseInt(n, 10, 64)
		if err != nil {
			return "", err
		}
		chunk := make([]byte, 256<<10)
		for i := 0; size > 0; i++ {
			k := min(size, int64(len(chunk)))
			if err := os.WriteFile(filepath.Join(dir, "fill"+strconv.Itoa(i)), chunk[:k], 0o644); err != nil {
				return "", err
			}
			size -= k
		}
		return "", nil
	case "sh":
		b, err := exec.Command("/bin/sh", "-c", rest).CombinedOutput()
		return string(b), err
	case "sleep-child":
		c := exec.Command("/bin/sleep", rest)
		if err := c.Start(); err != nil {
			return "", err
		}
		go c.Wait()
		return strconv.Itoa(c.Process.Pid), nil
	case "killkids":
		ents, _ := os.ReadDir("/proc")
		n := 0
		for _, e := range ents {
			pid, err := strconv.Atoi(e.Name())
			if err != nil || pid == os.Getpid() || pid == os.Getppid() || pid == 1 {
				continue
			}
			if syscall.Kill(pid, syscall.SIGKILL) == nil {
				n++
			}
		}
		return strconv.Itoa(n), nil
	case "stat":
		fi, err := os.Stat(rest)
		if err != nil {
			return "", err
		}
		st := fi.Sys().(*syscall.Stat_t)
		return fmt.Sprintf("%d %d %o", st.Uid, st.Gid, fi.Mode().Perm()), nil
	case "deadline":
		return strconv.FormatInt(deadline, 10), nil
	}
	return "", fmt.Errorf("unknown command %q", cmd)
}
