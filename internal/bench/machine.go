package bench

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// Machine describes the host for the record: CPU, memory, OS, kernel and
// the versions of the runtimes, so a table can be read against its host.
func Machine(ctx context.Context) []string {
	var lines []string
	model := "unknown CPU"
	if f, err := os.Open("/proc/cpuinfo"); err == nil {
		sc := bufio.NewScanner(f)
		for sc.Scan() {
			if k, v, ok := strings.Cut(sc.Text(), ":"); ok && strings.TrimSpace(k) == "model name" {
				model = strings.TrimSpace(v)
				break
			}
		}
		f.Close()
	}
	var si unix.Sysinfo_t
	mem := ""
	if unix.Sysinfo(&si) == nil {
		mem = fmt.Sprintf(", %.1f GiB RAM", float64(si.Totalram)*float64(si.Unit)/(1<<30))
	}
	lines = append(lines, fmt.Sprintf("CPU: %d × %s%s", runtime.NumCPU(), model, mem))
	osName := ""
	if b, err := os.ReadFile("/etc/os-release"); err == nil {
		for _, l := range strings.Split(string(b), "\n") {
			if v, ok := strings.CutPrefix(l, "PRETTY_NAME="); ok {
				osName = strings.Trim(v, `"`)
			}
		}
	}
	if b, err := os.ReadFile("/etc/debian_version"); err == nil {
		osName += " (" + strings.TrimSpace(string(b)) + ")"
	}
	var uts unix.Utsname
	kernel := ""
	if unix.Uname(&uts) == nil {
		kernel = unix.ByteSliceToString(uts.Release[:])
	}
	lines = append(lines, fmt.Sprintf("OS: %s, kernel %s", osName, kernel))
	var rts []string
	for _, rt := range []string{"crun", "runc", "runsc"} {
		if v := firstLine(ctx, rt, "--version"); v != "" {
			rts = append(rts, v)
		}
	}
	if v := firstLine(ctx, "docker", "version", "--format", "Docker Engine {{.Server.Version}}"); v != "" {
		rts = append(rts, v)
	}
	if len(rts) > 0 {
		lines = append(lines, "Runtimes: "+strings.Join(rts, "; "))
	}
	return lines
}

func firstLine(ctx context.Context, name string, args ...string) string {
	path, err := exec.LookPath(name)
	if err != nil {
		return ""
	}
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, path, args...).Output()
	if err != nil {
		return ""
	}
	first, _, _ := strings.Cut(strings.TrimSpace(string(out)), "\n")
	return first
}
