// Command liveagent stands in for the real agent (package agent) in the
// docker driver's tests of live sandboxes: run as `liveagent serve
// --deadline N [--connect SOCKET]`, it answers one line per request on
// stdin (or the socket) until EOF.
//
// Requests: "id", "args", "env", "cwd", "ifaces", "procs", "caps",
// "stat PATH", "read PATH", "write PATH DATA", "fill PATH BYTES",
// "sh CMD" (run by /bin/sh -c, stdin /dev/null, output combined). Each
// answer is one line: "ok " or "err " and a Go-quoted string.
package main

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
)

func main() {
	if (len(os.Args) != 4 && (len(os.Args) != 6 || os.Args[4] != "--connect")) || os.Args[1] != "serve" || os.Args[2] != "--deadline" {
		fmt.Fprintln(os.Stderr, "usage: liveagent serve --deadline UNIX [--connect SOCKET]")
		os.Exit(2)
	}
	if _, err := strconv.ParseInt(os.Args[3], 10, 64); err != nil {
		fmt.Fprintln(os.Stderr, "liveagent: bad deadline:", err)
		os.Exit(2)
	}
	var rd io.Reader = os.Stdin
	var wr io.Writer = os.Stdout
	if len(os.Args) == 6 {
		// The driver's socket under runc, as the real agent's --connect.
		c, err := net.Dial("unix", os.Args[5])
		if err != nil {
			fmt.Fprintln(os.Stderr, "liveagent:", err)
			os.Exit(1)
		}
		rd, wr = c, c
	}
	fmt.Fprintln(os.Stderr, "liveagent: serving")
	in := bufio.NewScanner(rd)
	in.Buffer(make([]byte, 1<<20), 1<<20)
	out := bufio.NewWriter(wr)
	for in.Scan() {
		s, err := handle(in.Text())
		if err != nil {
			fmt.Fprintf(out, "err %s\n", strconv.Quote(err.Error()))
		} else {
			fmt.Fprintf(out, "ok %s\n", strconv.Quote(s))
		}
		out.Flush()
	}
}

func handle(line string) (string, error) {
	cmd, rest, _ := strings.Cut(line, " ")
	switch cmd {
	case "id":
		return fmt.Sprintf("uid=%d gid=%d", os.Getuid(), os.Getgid()), nil
	case "args":
		return strings.Join(os.Args, " "), nil
	case "env":
		return strings.Join(os.Environ(), "\n"), nil
	case "cwd":
		return os.Getwd()
	case "ifaces":
		ifs, err := net.Interfaces()
		if err != nil {
			return "", err
		}
		var names []string
		for _, i := range ifs {
			names = append(names, i.Name)
		}
		return strings.Join(names, " "), nil
	case "procs":
		ps, err := filepath.Glob("/proc/[0-9]*")
		return strconv.Itoa(len(ps)), err
	case "caps":
		b, err := os.ReadFile("/proc/self/status")
		if err != nil {
			return "", err
		}
		for _, l := range strings.Split(string(b), "\n") {
			if v, ok := strings.CutPrefix(l, "CapEff:"); ok {
				return strings.TrimSpace(v), nil
			}
		}
		return "", errors.New("no CapEff")
	case "stat":
		var st syscall.Stat_t
		if err := syscall.Stat(rest, &st); err != nil {
			return "", err
		}
		return fmt.Sprintf("mode=%o uid=%d gid=%d", st.Mode&0o7777, st.Uid, st.Gid), nil
	case "read":
		b, err := os.ReadFile(rest)
		return string(b), err
	case "write":
		path, data, _ := strings.Cut(rest, " ")
		return "", os.WriteFile(path, []byte(data), 0o644)
	case "fill":
		path, n, _ := strings.Cut(rest, " ")
		size, err := strconv.Atoi(n)
		if err != nil {
			return "", err
		}
		f, err := os.Create(path)
		if err != nil {
			return "", err
		}
		_, err = f.Write(make([]byte, size))
		if cerr := f.Close(); err == nil {
			err = cerr
		}
		return "", err
	case "sh":
		c := exec.Command("/bin/sh", "-c", rest)
		b, err := c.CombinedOutput()
		var exit *exec.ExitError
		if errors.As(err, &exit) {
			return fmt.Sprintf("exit %d: %s", exit.ExitCode(), b), nil
		}
		if err != nil {
			return "", err
		}
		return "exit 0: " + string(b), nil
	}
	return "", fmt.Errorf("unknown request %q", cmd)
}
