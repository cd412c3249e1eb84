package agent

import (
	"os"
	"strconv"

	"github.com/kuboprotocol/vertal2kubo/internal/engine"
)

// The OOM killer of a sandbox's memory cgroup should take the code, not
// the agent: without the agent the sandbox is lost, while a killed
// command is reported as memory_exceeded and the sandbox goes on.
//
// The runtime starts the whole sandbox, the agent included, at
// engine.SandboxOOMScore; every process the agent starts (commands and
// the context kernels) is raised to engine.CodeOOMScore at once, so under
// the sandbox's memory limit a process of the code outranks the agent by
// a tenth of that limit.
//
// It is written after the fork, not inherited through it: the agent is
// not dumpable (cmd/vertal-agent), so its own /proc/self files belong to
// root and it cannot raise itself for a fork, while a child is dumpable
// again once it has exec'd, and its file belongs to the sandbox's uid.
// Until the write lands, for the few microseconds after exec, the child
// has the agent's score; its own size still weighs against it then.
//
// This ranks well-behaved code, not hostile code: this kernel lets an
// unprivileged process lower its own score (down to 0), so code that
// wants its agent killed can get that, which ends only its own sandbox.
var childOOMScore = []byte(strconv.Itoa(engine.CodeOOMScore))

// raiseOOMScore sets a just-started child's oom_score_adj. It is best
// effort: where the file is missing or refused (a runtime that hides
// it), the child keeps the agent's score, as before.
func raiseOOMScore(pid int) {
	_ = os.WriteFile("/proc/"+strconv.Itoa(pid)+"/oom_score_adj", childOOMScore, 0)
}
