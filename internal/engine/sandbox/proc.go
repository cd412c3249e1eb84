package sandbox

import (
	"fmt"
	"os"
	"strconv"
	"strings"
)

// ProcKB reads the "key   123 kB" line of a /proc file (a process's
// status or smaps_rollup, or meminfo) and returns the number of kB; key
// includes its colon ("VmRSS:").
func ProcKB(path, key string) (int64, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, err
	}
	for _, line := range strings.Split(string(b), "\n") {
		if rest, ok := strings.CutPrefix(line, key); ok {
			return strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(rest), "kB")), 10, 64)
		}
	}
	return 0, fmt.Errorf("no %s in %s", key, path)
}
