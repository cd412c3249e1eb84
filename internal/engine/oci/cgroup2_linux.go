package oci

import (
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"path"
	"sync"
	"time"

	cgroupsmode "github.com/containerd/cgroups/v3"

	"github.com/kuboprotocol/vertal2kubo/internal/engine/sandbox"
)

// v2Placement says where in the unified hierarchy the driver works. All
// paths are cgroup paths, relative to the cgroup2 mount ("/" is its root).
type v2Placement struct {
	// Delegated: the server runs in a cgroup delegated to it (a systemd
	// unit with Delegate=yes, or the root of a cgroup namespace, as in a
	// container), and keeps to that subtree.
	Delegated bool
	// Owned is the cgroup whose subtree the driver manages: the delegated
	// cgroup, or the hierarchy's root.
	Owned string
	// Supervisor is the leaf the server's own processes move to, so that
	// Owned holds no process and can hand controllers down (v2 allows
	// processes only in leaves, the root excepted). "" at the root.
	Supervisor string
	// Base is the cgroup the executions' parents are created in.
	Base string
}

// supervisorLeaf is the cgroup the server itself moves to in a delegated
// subtree.
const supervisorLeaf = "supervisor"

// placeV2 decides where the driver's cgroups live on a pure cgroup v2 host.
//
//   - selfCgroup is /proc/self/cgroup; on v2 it has one line, "0::<path>".
//   - mount is the cgroup2 mount (fs paths relative to it). At its root, a
//     cgroup.type file means the root is not the hierarchy's real root but
//     the root of our cgroup namespace: a container's delegated cgroup.
//   - delegated reports whether systemd marked a cgroup as delegated to
//     its unit (the trusted.delegate xattr, systemd 252+).
//   - parent is the base's name (Options.CgroupParent).
//
// In a delegated cgroup the base is "<own>/<parent>" and the server moves
// to "<own>/supervisor"; a second driver in the same process finds itself
// in that leaf and keeps the same placement. Anywhere else (no systemd, or
// a shell's session scope on a systemd host) the base is "/<parent>" at
// the root of the hierarchy, and the server stays where it is.
func placeV2(selfCgroup []byte, mount fs.FS, delegated func(cgroup string) bool, parent string) (v2Placement, error) {
	_, own, err := cgroupsmode.ParseCgroupFromReaderUnified(bytes.NewReader(selfCgroup))
	if err != nil {
		return v2Placement{}, fmt.Errorf("parsing /proc/self/cgroup: %w", err)
	}
	if own == "" || own[0] != '/' {
		return v2Placement{}, errors.New("parsing /proc/self/cgroup: no cgroup v2 entry (0::/path)")
	}
	if parent == "" || parent == supervisorLeaf || path.Base(parent) != parent {
		return v2Placement{}, fmt.Errorf("cgroup parent %q: want a plain name other than %q", parent, supervisorLeaf)
	}
	own = path.Clean(own)
	isDelegated := func(cg string) bool {
		if cg == "/" {
			_, err := fs.Stat(mount, "cgroup.type")
			return err == nil
		}
		return delegated(cg)
	}
	var p v2Placement
	switch {
	case isDelegated(own):
		p = v2Placement{Delegated: true, Owned: own, Supervisor: path.Join(own, supervisorLeaf)}
	case own != "/" && path.Base(own) == supervisorLeaf && isDelegated(path.Dir(own)):
		p = v2Placement{Delegated: true, Owned: path.Dir(own), Supervisor: own}
	default:
		p = v2Placement{Owned: "/"}
	}
	p.Base = path.Join(p.Owned, parent)
	return p, nil
}

// peakPoll follows a cgroup's memory.current to find its peak, on kernels
// without memory.peak (before 5.19). It can miss a spike shorter than its
// interval.
type peakPoll struct {
	file string
	done chan struct{}
	wg   sync.WaitGroup

	mu   sync.Mutex
	peak int64
}

func startPeakPoll(file string, every time.Duration) *peakPoll {
	p := &peakPoll{file: file, done: make(chan struct{})}
	p.sample()
	p.wg.Add(1)
	go func() {
		defer p.wg.Done()
		t := time.NewTicker(every)
		defer t.Stop()
		for {
			select {
			case <-p.done:
				return
			case <-t.C:
				p.sample()
			}
		}
	}()
	return p
}

func (p *peakPoll) sample() {
	n, err := sandbox.ReadCgroupInt(p.file)
	if err != nil {
		return
	}
	p.mu.Lock()
	p.peak = max(p.peak, n)
	p.mu.Unlock()
}

// max is the highest usage seen so far, this moment's included.
func (p *peakPoll) max() int64 {
	p.sample()
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.peak
}

// reset starts over from the current usage.
func (p *peakPoll) reset() {
	p.mu.Lock()
	p.peak = 0
	p.mu.Unlock()
	p.sample()
}

func (p *peakPoll) stop() {
	select {
	case <-p.done:
	default:
		close(p.done)
	}
	p.wg.Wait()
}
